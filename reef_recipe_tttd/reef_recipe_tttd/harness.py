"""The search harness: TTT-Discover's client side, talking to Reef like any client.

One step::

    parents  = archive.select(G)                  PUCT, lineage-blocked
    for each group g (parent) and rollout r < R:  sample through Reef (receipt + serving release)
        judge the attempt                         sandboxed; invalid → the task's invalid reward
    every rollout is a visit of its parent (and its ancestors); each parent keeps its best 2
    new, distinct valid children
    report every rollout at its grid coordinate   /reef/report, metadata step/group/rollout/...
    write the archive as pending; wait until the server serves the release trained on this
    grid (or says the grid trained nothing, search-only); commit the archive

A grid whose rollouts were served by different releases is not reported (the recipe would
reject it); an attempt that raises ``StepAborted`` (Guidance-TTT: an executor or judge error)
stops the step before anything is reported.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .archive import Child, Node, PUCTArchive
from .client import ReefClient, Sampled
from .judge import Judge
from .persist import RunDirectory, instruction_hash
from .prompts import solve_prompt
from .tasks import Task


class StepAborted(RuntimeError):
    """An attempt could not be scored honestly (executor or judge error): the step stops and
    nothing of it is reported."""


class StepFailed(RuntimeError):
    """The server did not turn the step's grid into a serving release (or said why not)."""


@dataclass(frozen=True)
class Outcome:
    """One judged attempt: ``score`` trains, ``raw`` ranks the archive, ``valid`` admits it."""

    score: float
    raw: float
    valid: bool
    solution: str | None
    output: str = ""
    summary: str = ""


class Attempt(Protocol):
    """How one rollout is made and judged (plain search, or Guidance-TTT)."""

    mode: str

    def prompt(self, parent: Node) -> list[dict[str, str]]: ...

    def judge(self, parent: Node, reply: str) -> Outcome: ...


class DirectAttempt:
    """The policy writes the solution itself; the task's judge scores it."""

    mode = "direct"

    def __init__(self, task: Task, judge: Judge | None = None):
        self.task = task
        self.judge_fn = judge or Judge(task)

    def prompt(self, parent: Node) -> list[dict[str, str]]:
        return solve_prompt(self.task, parent)

    def judge(self, parent: Node, reply: str) -> Outcome:
        v = self.judge_fn(reply)
        return Outcome(score=max(float(v.score), 0.0), raw=float(v.raw), valid=bool(v.valid),
                       solution=self.task.extract(reply) if v.valid else None, output=v.message)


@dataclass
class SearchSettings:
    groups: int = 8
    rollouts: int = 64
    c: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    archive_size: int = 1000
    children_per_expansion: int = 2
    concurrency: int = 8
    #: seconds to wait for the server to serve the step's release
    wait_timeout_s: float = 1800.0
    poll_s: float = 0.5
    #: identifies the search in report metadata (several searches may share a server)
    run: str = ""

    def __post_init__(self) -> None:
        if self.groups < 1 or self.rollouts < 2:
            raise ValueError("a grid needs 1 or more groups and 2 or more rollouts per group")


@dataclass
class StepRecord:
    step: int
    samples: int
    valid_fraction: float
    reward_mean: float
    reward_max: float
    archive_best: float
    release_id: str | None
    committed_release: str | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Rollout:
    group: int
    rollout: int
    parent: Node
    sampled: Sampled
    outcome: Outcome


class SearchHarness:
    """Runs TTT-Discover steps against one Reef scenario, keeping the archive in ``run_dir``."""

    def __init__(self, task: Task, client: ReefClient, run_dir: str | Path, settings: SearchSettings | None = None,
                 attempt: Attempt | None = None, log: Callable[[str], None] | None = None):
        self.task = task
        self.client = client
        self.settings = settings or SearchSettings()
        self.attempt = attempt or DirectAttempt(task)
        self.log = log or (lambda message: None)
        s = self.settings
        self.max_tokens = s.max_tokens or task.max_tokens
        self.dir = RunDirectory(run_dir, self.identity())
        self.archive, self.history, self.next_step = self._load()
        if not s.run:
            s.run = self._run_id

    def identity(self) -> dict[str, Any]:
        s = self.settings
        return {"task": self.task.identity(), "instruction": instruction_hash(self.task.instruction),
                "model": self.client.model, "groups": s.groups, "rollouts": s.rollouts,
                "sampling": {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens or self.task.max_tokens},
                "puct_c": s.c, "invalid_reward": self.task.invalid_reward, "mode": self.attempt.mode}

    def _load(self) -> tuple[PUCTArchive, list[dict[str, Any]], int]:
        pending = self.dir.pending()
        if pending is not None:
            self.log(f"resuming: step {pending['step']} was reported but not committed; waiting for its release")
            self._wait(pending["wait"])
            self.dir.commit(pending["wait"].get("release_id"))
        data = self.dir.committed()
        if data is None:
            self._run_id = self.settings.run or uuid.uuid4().hex[:12]
            archive = PUCTArchive(self.settings.c, self.settings.archive_size, self.settings.children_per_expansion)
            for solution in self.task.seeds():
                v = self.task.verify(solution)
                if not v.valid:
                    raise ValueError(f"task {self.task.name}: its seed solution is invalid ({v.message})")
                archive.add_seed(solution, v.raw, output=v.message, summary=v.message)
            if not archive.nodes:
                archive.add_seed(None, self.task.invalid_reward)
            return archive, [], 0
        self._run_id = data.get("run") or self.settings.run or uuid.uuid4().hex[:12]
        return PUCTArchive.from_json(data["archive"]), list(data["history"]), int(data["step"]) + 1

    # ------------------------------------------------------------------ steps

    def run(self, steps: int) -> list[dict[str, Any]]:
        """Run steps until ``steps`` are committed in this run directory; the history."""
        while self.next_step < steps:
            self.step()
        return self.history

    def step(self) -> StepRecord:
        s, step, started = self.settings, self.next_step, time.monotonic()
        parents = self.archive.select(s.groups)
        jobs = [(g, r, parents[g]) for g in range(s.groups) for r in range(s.rollouts)]
        with ThreadPoolExecutor(max_workers=max(1, s.concurrency)) as pool:
            rollouts = list(pool.map(lambda job: self._one(step, *job), jobs))
        releases = {r.sampled.release_id for r in rollouts}
        if len(releases) > 1:
            raise StepFailed(f"step {step}: the grid was served by several releases {sorted(map(str, releases))}; "
                             "the recipe rejects such a grid (is something else publishing to this scenario?)")
        for r in rollouts:
            self.archive.visit(r.parent.id)
        for g, parent in enumerate(parents):
            children = [Child(r.outcome.solution, r.outcome.raw, r.outcome.score, r.outcome.output, r.outcome.summary)
                        for r in rollouts if r.group == g and r.outcome.valid and r.outcome.solution is not None
                        and math.isfinite(r.outcome.raw)]
            self.archive.expand(parent.id, children, step=step)
        best = self.archive.best_value(self.task.invalid_reward)
        wait = {"candidates_before": [c["id"] for c in self.client.candidates()], "release_id": releases.pop()}
        for r in rollouts:
            self.client.report(r.sampled.receipt, r.outcome.score, self._metadata(step, r, best),
                               report_id=f"tttd-{s.run}-s{step}-g{r.group}-r{r.rollout}")
        scores = [r.outcome.score for r in rollouts]
        valid = sum(r.outcome.valid for r in rollouts) / len(rollouts)
        record = StepRecord(step=step, samples=len(rollouts), valid_fraction=valid,
                            reward_mean=sum(scores) / len(scores), reward_max=max(scores), archive_best=best,
                            release_id=wait["release_id"])
        history = self.history + [asdict(record)]
        self.dir.write_pending(step, self.archive, history, wait, run=s.run)
        record.committed_release = self._wait(wait)
        record.seconds = time.monotonic() - started
        history[-1] = asdict(record)
        self.dir.write_pending(step, self.archive, history, wait, run=s.run)
        self.dir.commit(record.committed_release)
        self.history, self.next_step = history, step + 1
        self.log(f"step {step}: valid {record.valid_fraction:.0%}, reward mean {record.reward_mean:.3f} max "
                 f"{record.reward_max:.3f}, archive best {best:.4f}, serving {record.committed_release}")
        return record

    def _one(self, step: int, group: int, rollout: int, parent: Node) -> _Rollout:
        s = self.settings
        sampled = self.client.sample(self.attempt.prompt(parent), temperature=s.temperature, top_p=s.top_p,
                                     max_tokens=self.max_tokens,
                                     tags={"tttd-step": step, "tttd-group": group, "tttd-rollout": rollout})
        return _Rollout(group, rollout, parent, sampled, self.attempt.judge(parent, sampled.text))

    def _metadata(self, step: int, r: _Rollout, best: float) -> dict[str, Any]:
        s = self.settings
        return {"step": step, "group": r.group, "rollout": r.rollout, "groups_per_step": s.groups,
                "rollouts_per_group": s.rollouts, "comparison_set": f"tttd-step-{step}-group-{r.group}",
                "algorithm": "tttd", "run": s.run, "mode": self.attempt.mode, "valid": r.outcome.valid,
                "raw_score": r.outcome.raw if math.isfinite(r.outcome.raw) else None,
                "parent": r.parent.id, "archive_best": best}

    # ------------------------------------------------------------------ waiting for the server

    def _wait(self, wait: dict[str, Any]) -> str | None:
        """Block until the server has dealt with the step's grid: the release trained on it is
        serving (its id), or the grid was consumed without training (search-only: the release
        that served it). ``StepFailed`` when the server says it failed or nothing happens."""
        before = set(wait["candidates_before"])
        deadline = time.monotonic() + self.settings.wait_timeout_s
        while time.monotonic() < deadline:
            fresh = [c for c in self.client.candidates() if c["id"] not in before]
            for cand in fresh:
                status = cand.get("status")
                if status in ("error", "rejected", "conflict"):
                    raise StepFailed(f"the server's step on this grid ended {status}: {cand.get('reason')}")
                if status == "skipped":
                    return wait.get("release_id")
                if status in ("selected", "published") and cand.get("release_id"):
                    state = self.client.scenario_state()
                    if state.get("serving_release_id") == cand["release_id"]:
                        return cand["release_id"]
            time.sleep(self.settings.poll_s)
        raise StepFailed(f"no release was served for the grid within {self.settings.wait_timeout_s:g} s: is the "
                         f"server's loop enabled, with recipe=tttd and a {self.settings.groups}x{self.settings.rollouts} "
                         "grid (groups_per_step, rollouts_per_group)?")

    # ------------------------------------------------------------------ reading

    def best(self) -> Node | None:
        return self.archive.best()
