"""Held-out tasks for evaluators: loading, grading, serving conditions and paired episodes.

A task is ``{id?, prompt | messages, system?, expected?, pattern?, grader?}``. Each episode
sends the task through the scenario's runtime with one side's harness applied and grades
the answer with ``grader(output, task) -> float``. An episode that crashed (runtime error,
timeout, grader error, a grader's NaN or infinite score) scores ``None``; the statistics (``reef_core.commit.stats``) count it
as 0 for the side that crashed.

Episodes run at the scenario's serving conditions: ``serving_params`` reads the sampling
fields (temperature, top_p, max_tokens…) that recent requests of the scenario used, so a
harness is judged at the temperature it will serve at, not only greedily.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..kit.graders import BUILTIN_GRADERS, Grader, grade_contains, grade_exact, grade_regex, regex_problem
from ..kit.tasks import task_body
from ..observe.experience import response_text
from ..types import ActiveRelease, Candidate, Episode

log = logging.getLogger("reef.commit")

__all__ = ["BUILTIN_GRADERS", "Grader", "grade_contains", "grade_exact", "grade_regex", "task_body"]  # re-exported

# --------------------------------------------------------------------------- graders (reef_core.kit.graders)

_NEEDS = {"exact": "expected", "contains": "expected", "regex": "pattern"}


# --------------------------------------------------------------------------- tasks


def load_tasks(tasks: Sequence[dict[str, Any]] | str, default_grader: str,
               graders: dict[str, Grader]) -> list[dict[str, Any]]:
    """Validated tasks from a list or a JSONL file path; every problem is a ConfigError."""
    if isinstance(tasks, (str, Path)):
        path = Path(tasks).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read evaluation tasks file {str(path)!r}: {exc.strerror}") from None
        items = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
    else:
        items = [dict(t) for t in tasks]
    if not items:
        raise ConfigError("evaluator needs at least one task (option 'tasks': a list or a JSONL file path)")
    out = []
    for n, task in enumerate(items, 1):
        if not isinstance(task, dict):
            raise ConfigError(f"evaluation task {n} is not an object")
        task = dict(task)
        task.setdefault("id", f"task-{n}")
        if not task.get("prompt") and not task.get("messages"):
            raise ConfigError(f"evaluation task {task['id']!r} needs 'prompt' or 'messages'")
        if not task.get("grader"):
            task["grader"] = "regex" if task.get("pattern") else default_grader
        grader = task["grader"]
        if grader not in graders:
            raise ConfigError(f"evaluation task {task['id']!r} names unknown grader {grader!r}; "
                              f"available: {', '.join(sorted(graders))}")
        need = _NEEDS.get(grader)
        if need and not task.get(need) and not (need == "pattern" and task.get("expected")):
            raise ConfigError(f"evaluation task {task['id']!r} uses grader {grader!r} and needs {need!r}")
        if grader == "regex":
            problem = regex_problem(task.get("pattern") or task["expected"])
            if problem:
                raise ConfigError(f"evaluation task {task['id']!r} has an invalid pattern: {problem}")
        out.append(task)
    return out


# --------------------------------------------------------------------------- serving conditions

#: the sampling fields a runtime of each dialect takes from a request
_SAMPLING = {
    "openai": ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens",
               "presence_penalty", "frequency_penalty", "repetition_penalty"),
    "anthropic": ("temperature", "top_p", "top_k", "max_tokens"),
}
#: the ones the server carries across dialects (``serve/dialects``); a client of the other
#: dialect reaches the runtime with no other sampling field
_PORTABLE = ("temperature", "top_p", "max_tokens")
#: how many of the scenario's newest answered requests ``serving_params`` reads
SERVING_WINDOW = 200
#: ``repeats: auto`` for a sampled runtime (temperature above 0, or the runtime's default)
AUTO_REPEATS = 5
_ABSENT = object()


def request_sampling(request: Any, client_dialect: str, runtime_dialect: str) -> dict[str, Any]:
    """The sampling fields of a recorded client request, as the runtime received them."""
    if not isinstance(request, dict):
        return {}
    same = client_dialect == runtime_dialect
    out: dict[str, Any] = {}
    for key in _SAMPLING.get(runtime_dialect, _PORTABLE) if same else _PORTABLE:
        value = request.get(key)
        if key == "max_tokens" and not same and client_dialect == "openai":
            value = request.get("max_completion_tokens") or value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def serving_params(records: Iterable[Any], runtime_dialect: str) -> dict[str, Any]:
    """The scenario's serving sampling parameters, from its recorded requests (newest first).

    Per field, the value most requests used, leaving the field out when most left it out
    (the runtime's default served them); ties go to the newest request. Records are
    anything with ``request`` and ``route`` (``openai.chat`` / ``anthropic.messages``).
    """
    counts: dict[str, Counter] = {key: Counter() for key in _SAMPLING[runtime_dialect]}
    for record in records:
        route = str(getattr(record, "route", None) or "")
        client = route.split(".", 1)[0] if route.split(".", 1)[0] in _SAMPLING else runtime_dialect
        sampled = request_sampling(getattr(record, "request", None), client, runtime_dialect)
        for key, counter in counts.items():
            counter[sampled.get(key, _ABSENT)] += 1
    out: dict[str, Any] = {}
    for key, counter in counts.items():
        if counter:
            value = counter.most_common(1)[0][0]
            if value is not _ABSENT:
                out[key] = value
    return out


@dataclass
class ServingConditions:
    """What ``task_suite`` knows of how the scenario serves.

    ``source``: ``context`` (``EvalContext.serving_params`` given), ``records`` (read from
    ``records`` recent requests; empty ``params``: the runtime's defaults served them all) or
    ``unknown`` (no store to read).
    """

    params: dict[str, Any]
    source: str
    records: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "records": self.records, "params": self.params}


def serving_conditions(ctx: Any) -> ServingConditions:
    """The scenario's serving sampling parameters, as far as ``ctx`` can tell."""
    given = getattr(ctx, "serving_params", None)
    if given is not None:
        return ServingConditions(dict(given), "context")
    store = getattr(ctx, "store", None)
    if store is None:
        return ServingConditions({}, "unknown")
    seen = 0

    def counted(records: Iterable[Any]) -> Iterator[Any]:
        nonlocal seen
        for record in records:
            seen += 1
            yield record

    # a page of bodies at a time: the window's requests may each be as large as a body can be
    records = store.iter_records(ctx.scenario, kind="inference", status="ok", limit=SERVING_WINDOW,
                                 newest_first=True)
    params = serving_params(counted(records), ctx.dialect)
    return ServingConditions(params, "records", seen)


def episode_params(serving: ServingConditions, params: dict[str, Any]) -> dict[str, Any]:
    """The request fields every episode carries: serving's, then the evaluator's ``params``
    over them (a ``None`` there removes the field: the runtime's default applies)."""
    merged = {**serving.params, **params}
    return {k: v for k, v in merged.items() if v is not None}


def auto_repeats(params: dict[str, Any], serving: ServingConditions) -> int:
    """``repeats: auto``: 1 at temperature 0 (the runtime answers deterministically), else
    ``AUTO_REPEATS``. An unset temperature is the runtime's default, sampled for the OpenAI
    and Anthropic APIs and for the local runtimes alike; only when nothing at all is known of
    serving (no store, no temperature) does ``auto`` stay at 1."""
    temperature = params.get("temperature")
    if temperature is not None:
        return 1 if float(temperature) == 0.0 else AUTO_REPEATS
    return 1 if serving.source == "unknown" else AUTO_REPEATS


# --------------------------------------------------------------------------- held out


def normalize_prompt(text: str) -> str:
    """A prompt as contamination compares it: whitespace runs collapsed, case folded."""
    return " ".join(text.split()).casefold()


def user_texts(body: Any) -> list[str]:
    """The text of each user message of a request body (any route's: a Responses body's input
    items count as the messages they stand for)."""
    if isinstance(body, dict) and "messages" not in body and "input" in body:
        from ..kit.records import chat_request

        body = chat_request(body)
    messages = body.get("messages") if isinstance(body, dict) else None
    out = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, list):
            # joined as a traffic task's prompt is (``kit.tasks.content_text``, a part a line): the
            # contamination check compares the two, and "".join missed an identical request
            content = "\n".join(p.get("text", "") for p in content
                                if isinstance(p, dict) and p.get("type") in ("text", "input_text"))
        if isinstance(content, str) and content.strip():
            out.append(content)
    return out


def training_prompts(ctx: Any, candidate: Candidate) -> frozenset[str]:
    """Normalized user texts of the candidate's training batch (``EvalContext.training_prompts``
    when given, else read from the store by ``candidate.record_ids``)."""
    given = getattr(ctx, "training_prompts", None)
    if given is not None:
        return frozenset(normalize_prompt(p) for p in given)
    store = getattr(ctx, "store", None)
    if store is None or not candidate.record_ids:
        return frozenset()
    records = store.get_records(candidate.record_ids)
    return frozenset(normalize_prompt(t) for r in records.values() for t in user_texts(r.request))


def contaminated_tasks(tasks: Sequence[dict[str, Any]], prompts: frozenset[str]) -> list[str]:
    """Ids of the tasks whose user text is one of ``prompts`` (a task the candidate trained on)."""
    if not prompts:
        return []
    out = []
    for task in tasks:
        texts = [task["prompt"]] if task.get("prompt") else user_texts({"messages": task.get("messages")})
        if any(normalize_prompt(str(t)) in prompts for t in texts):
            out.append(task["id"])
    return out


# --------------------------------------------------------------------------- episodes

SIDES = ("candidate", "current")


@dataclass
class PairedResult:
    """Every task run ``repeats`` times on each side. ``tasks``/``candidate``/``current`` are
    task-major, one entry per task × repeat; ``episodes`` the same episodes in full, sorted by
    task, repeat, side."""

    tasks: list[str]
    candidate: list[float | None]
    current: list[float | None]
    errors: list[str]
    episodes: list[Episode] = field(default_factory=list)
    repeats: int = 1

    def by_task(self, scores: list[float | None]) -> list[list[float | None]]:
        """``scores`` cut into one list of repeats per task."""
        r = self.repeats
        return [scores[i:i + r] for i in range(0, len(scores), r)]

    def compare(self) -> dict[str, int]:
        """Wins, losses and ties of paired episodes one by one (a crash ranks below any score)."""
        wins = losses = ties = 0
        for c, k in zip(self.candidate, self.current):
            rc = float("-inf") if c is None else c
            rk = float("-inf") if k is None else k
            if rc > rk:
                wins += 1
            elif rc < rk:
                losses += 1
            else:
                ties += 1
        return {"wins": wins, "losses": losses, "ties": ties}

    @staticmethod
    def mean(scores: list[float | None]) -> float:
        """Mean score, a crashed episode counting as 0."""
        return sum(s or 0.0 for s in scores) / len(scores) if scores else 0.0

    @classmethod
    def combine(cls, rounds: Sequence[PairedResult]) -> PairedResult:
        """Rounds of the same tasks as one result: each task's repeats of every round in turn,
        so the lists stay task-major and the episodes sorted by task, repeat, side."""
        first = rounds[0]
        if len(rounds) == 1:
            return first
        n_tasks = len(first.tasks) // first.repeats
        tasks: list[str] = []
        candidate: list[float | None] = []
        current: list[float | None] = []
        episodes: list[Episode] = []
        for i in range(n_tasks):
            for r in rounds:
                cut = slice(i * r.repeats, (i + 1) * r.repeats)
                tasks += r.tasks[cut]
                candidate += r.candidate[cut]
                current += r.current[cut]
                episodes += r.episodes[i * r.repeats * len(SIDES):(i + 1) * r.repeats * len(SIDES)]
        return cls(tasks=tasks, candidate=candidate, current=current,
                   errors=[e for r in rounds for e in r.errors], episodes=episodes,
                   repeats=sum(r.repeats for r in rounds))


def run_paired(tasks: list[dict[str, Any]], candidate: ActiveRelease, current: ActiveRelease | None,
               ctx: Any, graders: dict[str, Grader], *, model: str, params: dict[str, Any],
               repeats: int, episode_timeout_s: float, concurrency: int, first_repeat: int = 0,
               label: str = "") -> PairedResult:
    """Run every task ``repeats`` times on each side and grade the answers (the episodes'
    repeat numbers start at ``first_repeat``: a later round of the same suite).

    Episodes go to the runtime ``concurrency`` at a time, repeat by repeat with both sides
    of a task next to each other, so both sides meet the same load and repeats cost wall
    time in proportion to the runtime's batch throughput.
    """
    errors: list[str] = []
    releases = {"candidate": candidate, "current": current}

    def episode(index: int, repeat: int, side: str) -> Episode:
        task = tasks[index]
        sent: dict[str, Any] = {}
        answer = score = error = None
        started = time.perf_counter()
        try:
            body = task_body(task, ctx.dialect, task.get("model") or model, params)
            prepared = ctx.prepare(body, releases[side])
            sent = copy.deepcopy(prepared)  # as sent: the runtime may change its copy
            answer = response_text(ctx.send(prepared, releases[side], timeout_s=episode_timeout_s))
            score = float(graders[task["grader"]](answer, task))
            if not math.isfinite(score):  # no score: NaN would rank as a tie, inf above any score
                bad, score = score, None
                raise ValueError(f"grader {task['grader']!r} returned {bad!r}, not a finite score")
        except Exception as exc:  # noqa: BLE001 - a crashed episode scores None, the suite goes on
            error = f"{type(exc).__name__}: {exc}"
            errors.append(f"{task['id']} ({side}): {error}")
        finally:
            bar.advance()
        return Episode(task_id=task["id"], side=side, repeat=repeat, request=sent, answer=answer, score=score,
                       grader=task["grader"], latency_ms=(time.perf_counter() - started) * 1000.0, error=error)

    plan = [(i, r, side) for r in range(first_repeat, first_repeat + repeats) for i in range(len(tasks))
            for side in SIDES]
    with ctx.progress.task(f"evaluating {len(tasks) * repeats} paired episode(s){label}", total=len(plan)) as bar:
        with ThreadPoolExecutor(max_workers=max(concurrency, 1), thread_name_prefix="reef-episode") as pool:
            futures = {(i, r, side): pool.submit(episode, i, r, side) for i, r, side in plan}
            done = {key: f.result() for key, f in futures.items()}
    order = sorted(done, key=lambda key: (key[0], key[1], SIDES.index(key[2])))
    episodes = [done[key] for key in order]
    return PairedResult(
        tasks=[t["id"] for t in tasks for _ in range(repeats)],
        candidate=[e.score for e in episodes if e.side == "candidate"],
        current=[e.score for e in episodes if e.side == "current"],
        errors=errors, episodes=episodes, repeats=repeats)
