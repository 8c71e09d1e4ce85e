"""``reef demo``: simulated users teach a live Reef their hidden preference, and the demo shows it.

One real ``reef serve`` (the embedded SmolLM2-135M-Instruct, ``runtime=local``) in a child
process; everything else goes through its HTTP API, as any client's would:

1. the simulated users' score on held-out questions, greedy, before any learning;
2. rounds of traffic: each user asks a question through the official ``openai`` SDK, grades
   the answer with the preference's deterministic grader and posts a report quoting the
   receipt (score 1 or 0; on a 0, feedback saying what they want);
3. the server's own loop proposes candidates from those reports, gates them (``task_suite`` on
   gate questions graded by the same test) and hot-swaps the winners; the demo waits until it
   has settled;
4. the same held-out questions again. Before/after is the mean score of the same questions on
   the release serving before vs after learning; nothing here grades, edits or publishes a
   release itself.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

from .preference import PREFERENCE, Preference
from .progress import DemoProgress, Turn, demo_progress
from .questions import deal
from .server import SCENARIO, DemoServer

#: answers in flight at once: the local runtime decodes up to 8 sequences in one forward
CONCURRENCY = 8


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: ``--quick`` for the test suite, the default for people."""

    users: int
    rounds: int
    heldout: int
    gate: int
    settle_timeout_s: float

    @classmethod
    def choose(cls, quick: bool, users: int | None) -> Plan:
        if quick:
            return cls(users=users or 3, rounds=4, heldout=8, gate=12, settle_timeout_s=240.0)
        return cls(users=users or 4, rounds=8, heldout=16, gate=12, settle_timeout_s=300.0)


def recipe_config(recipe: str, plan: Plan) -> dict[str, Any]:
    """The recipe's options for the demo: ``feedback_rules`` learns from every round's feedback
    (a batch is one round of reports) and writes each feedback as a rule; any other recipe runs
    with its own defaults."""
    if recipe == "feedback_rules":
        return {"name": recipe, "batch_size": plan.users, "max_score": 0.5, "proposer": None}
    return {"name": recipe}


def server_config(recipe: str, plan: Plan, preference: Preference, gate: list[str]) -> dict[str, Any]:
    return {
        "server": {"default_scenario": SCENARIO, "log_level": "warning"},
        "recipe": recipe_config(recipe, plan),
        # greedy episodes, one per question and side: deterministic and cheap on a CPU; the
        # bootstrap still asks for an improvement beyond the questions' spread
        "evaluator": {"name": "task_suite", "grader": "regex", "rule": "bootstrap", "margin": 0.0,
                      "confidence": 0.9, "params": {"temperature": 0, "max_tokens": preference.max_tokens},
                      "tasks": [{"id": f"gate-{i}", "prompt": q, "pattern": preference.pattern}
                                for i, q in enumerate(gate)],
                      "episode_timeout_s": 300, "timeout_s": 900, "concurrency": CONCURRENCY},
        "loop": {"enabled": True, "schedule_s": None},
    }


@dataclass
class DemoResult:
    recipe: str
    preference: str
    users: int
    reports: int
    before: float
    after: float
    published: int
    rejected: int
    #: candidates neither published nor rejected, by status (``skipped``: the recipe had nothing new)
    other_candidates: dict[str, int]
    learnt: list[str]
    curve: list[dict[str, Any]]
    settled: bool
    seconds: float
    dashboard: str
    png: str | None = None
    #: each release published in the run, in order: {"release_id", "reports" (sent when it was
    #: published, at the round's grain), "summary"}; the curve marks each
    releases: list[dict[str, Any]] = field(default_factory=list)
    heldout_before: list[dict[str, Any]] = field(default_factory=list)
    heldout_after: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rose(self) -> bool:
        return self.after > self.before


def _scores(server: DemoServer, preference: Preference, questions: list[str], pool: ThreadPoolExecutor,
            progress: DemoProgress, label: str) -> list[dict[str, Any]]:
    """Greedy answers to ``questions`` (no reports), each graded."""
    task = progress.phase(label, total=len(questions))

    def one(question: str) -> dict[str, Any]:
        _, answer, release = server.ask(question, max_tokens=preference.max_tokens, tag="heldout")
        progress.advance(task)
        return {"question": question, "answer": answer, "score": preference.grade(answer), "release": release}

    rows = list(pool.map(one, questions))
    progress.finish(task)
    return rows


def published_releases(candidates: list[dict[str, Any]], posted: list[tuple[datetime, int]]) -> list[dict[str, Any]]:
    """The published ``candidates`` in the order they were decided, each with the reports sent
    when it was: the last round whose reports were all posted (``posted``: (when, reports sent
    so far), in order) before its ``decided_at``."""
    out = []
    for c in sorted((c for c in candidates if c.get("status") == "published" and c.get("decided_at")),
                    key=lambda c: c["decided_at"]):
        decided = datetime.fromisoformat(c["decided_at"].replace("Z", "+00:00"))
        sent = max((n for when, n in posted if when <= decided), default=0)
        out.append({"release_id": c.get("release_id"), "reports": sent, "summary": c.get("summary") or ""})
    return out


def _mean(rows: list[dict[str, Any]]) -> float:
    return sum(r["score"] for r in rows) / len(rows) if rows else 0.0


def run_demo(*, recipe: str, plan: Plan, port: int, out: Path, console: Console,
             preference: Preference = PREFERENCE, keep: bool = False) -> tuple[DemoResult, DemoServer]:
    """Run the demo; the server is returned still running when ``keep``, else stopped."""
    start = time.monotonic()
    qs = deal(heldout=plan.heldout, gate=plan.gate, traffic=plan.users * plan.rounds)
    workdir = out / f"server-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    server = DemoServer(workdir, server_config(recipe, plan, preference, qs.gate),
                        ["runtime=local", f"recipe={recipe}", "evaluator=task_suite"], port=port)
    progress = demo_progress(console)
    users = [f"user-{i + 1}" for i in range(plan.users)]
    curve: list[dict[str, Any]] = []
    posted: list[tuple[datetime, int]] = [(datetime.now(timezone.utc), 0)]
    ok = False
    try:
        with progress:
            boot = progress.phase("starting reef serve (SmolLM2-135M-Instruct)", total=1)
            server.start()
            server.wait_ready()
            progress.finish(boot)
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                before = _scores(server, preference, qs.heldout, pool, progress, "held-out questions, before")
                traffic = progress.phase("users ask, grade and report", total=len(qs.traffic))

                def turn(user: str, question: str) -> Turn:
                    receipt, answer, release = server.ask(question, max_tokens=preference.max_tokens, tag="traffic")
                    score = preference.grade(answer)
                    server.report(receipt, score, None if score >= 1.0 else preference.feedback, user)
                    progress.advance(traffic)
                    return Turn(user, question, answer, score, release)

                for r in range(plan.rounds):
                    chunk = qs.traffic[r * plan.users:(r + 1) * plan.users]
                    turns = list(pool.map(turn, users, chunk))
                    posted.append((datetime.now(timezone.utc), (r + 1) * plan.users))
                    progress.round_done(r + 1, plan.rounds, turns)
                    progress.observe(server.loop_state(), server.candidates())
                    curve.append({"round": r + 1, "reports": (r + 1) * plan.users,
                                  "score": sum(t.score for t in turns) / len(turns),
                                  "published": progress.counts.get("published", 0),
                                  # the release that answered most of the round (None: the base)
                                  "serving": Counter(t.release for t in turns).most_common(1)[0][0]})
                progress.finish(traffic)
                settle = progress.phase("learning settles (candidates gated, winners published)")
                deadline, calm, settled = time.monotonic() + plan.settle_timeout_s, 0, False
                while time.monotonic() < deadline:
                    progress.observe(server.loop_state(), server.candidates())
                    calm = calm + 1 if server.settled() else 0
                    if calm >= 2:
                        settled = True
                        break
                    time.sleep(1.0)
                progress.finish(settle)
                after = _scores(server, preference, qs.heldout, pool, progress, "held-out questions, after")
            candidates = server.candidates()
            progress.observe(server.loop_state(), candidates)
        counts = progress.counts
        learnt = [c.get("summary") or c["id"] for c in reversed(candidates) if c["status"] == "published"]
        result = DemoResult(
            recipe=recipe, preference=preference.description, users=plan.users, reports=len(qs.traffic),
            before=_mean(before), after=_mean(after), published=counts.get("published", 0),
            rejected=counts.get("rejected", 0),
            other_candidates={s: n for s, n in counts.items() if s not in ("published", "rejected")},
            learnt=learnt, curve=curve, settled=settled, seconds=time.monotonic() - start,
            dashboard=f"{server.url}/ui", heldout_before=before, heldout_after=after,
            releases=published_releases(candidates, posted))
        ok = True
        return result, server
    except BaseException:
        if not ok:
            console.print(f"[red]the demo stopped; the server's log ({server.log_path}) ends with:[/red]\n"
                          f"{server.log_tail()}", markup=True, highlight=False)
        raise
    finally:
        if not (ok and keep):
            server.stop()


def write_summary(result: DemoResult, out: Path) -> Path:
    path = out / "summary.json"
    path.write_text(json.dumps({**asdict(result), "rose": result.rose}, indent=2, ensure_ascii=False) + "\n")
    return path


def summary_panel(result: DemoResult, *, serving: bool = False) -> Panel:
    """The closing summary: what was published and rejected, the score before and after, and
    what was learnt, said plainly (including when nothing was)."""
    lines = [
        f"recipe [bold]{result.recipe}[/bold]; the users' hidden preference: {result.preference}",
        f"{result.reports} reports from {result.users} users; releases published: [bold]{result.published}[/bold], "
        f"candidates rejected: {result.rejected}"
        + "".join(f", {status}: {n}" for status, n in sorted(result.other_candidates.items())),
        f"users' score on held-out questions: before [bold]{result.before:.2f}[/bold] → after [bold]{result.after:.2f}[/bold]",
    ]
    if result.learnt:
        lines.append("learnt: " + "; ".join(result.learnt))
    if result.rose and result.published:
        lines.append("[green]The model now follows the preference on questions it never learnt from.[/green]")
    elif result.published:
        lines.append("[yellow]A release was published, but the score on held-out questions did not rise.[/yellow]")
    else:
        lines.append(f"[yellow]Nothing was published: the {result.recipe} recipe did not produce an update that "
                     "SmolLM2-135M follows well enough to pass the gate in this run.[/yellow]")
    if not result.settled:
        lines.append("[yellow]Learning had not settled when the demo measured 'after'.[/yellow]")
    if result.png:
        lines.append(f"learning curve: {result.png}")
    lines.append(f"dashboard: {result.dashboard}" + ("" if serving else "  (the server has stopped: --keep-serving "
                                                      "keeps it open)"))
    lines.append(f"took {result.seconds / 60:.1f} min")
    return Panel("\n".join(lines), title="reef demo", expand=False)
