"""Computed feedback: turns from traffic, judged off the request path, stored as reports.

One ``TurnProcessor`` per scenario whose recipe is ``openclaw``. Every stored record goes
through its ``SessionIndex`` (``ingest``, on the event loop, a few dictionary operations); a
turn that gets its next state is judged in the background, at most ``prm_concurrency`` turns
at once, and dispatched. A turn the table trains on becomes a *computed report*: id
``openclaw_<record id>``, quoting that one record, ``score`` the reward, ``feedback`` the next
state, ``metadata.openclaw`` the judge's votes, hints and the dispatch. Storing it wakes the
learning loop like any report, so the eligibility pool, consumption, returns after a rejection
and ``GET /reef/scenarios/{s}/records`` work for these turns as for reported ones.

Every judged turn (trained or retired) is also a line of ``<state>/turns.jsonl``, and the
counters (``counters()``) say how many turns went each way, and why others never reached the
table (side calls, retries, expiry, no top-K capture).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef_train import recorded_tokens_problem

from .dispatch import DispatchCounters, dispatch
from .prm import MAX_HINT_CHARS, JudgeResult, judge_turn
from .sessions import BoundTurn, SessionIndex

log = logging.getLogger("reef.openclaw")

REPORT_PREFIX = "openclaw_"
METADATA_KEY = "openclaw"


@dataclass(frozen=True)
class ProcessorOptions:
    session_ttl_s: float = 900.0
    max_open_sessions: int = 1000
    main_turn_requires_tools: bool = False
    prm_m: int = 3
    prm_temperature: float = 0.6
    prm_max_tokens: int = 1024
    prm_timeout_s: float = 120.0
    prm_concurrency: int = 8
    prm_max_hint_candidates: int = 3
    top_k: int = 4


def capture_problem(record: Any, top_k: int, vocab_size: int | None = None) -> str | None:
    """Why ``record`` cannot train OpenClaw (``no_tokens``, ``bad_tokens``, ``no_topk``), or None: it
    needs its prompt and response token ids, one sampling logprob and one top-K list per response
    token, all well formed (``reef_train.recorded_tokens_problem``; a top-K entry is ``[id, logprob]``
    with a token id), every id inside the base model's vocabulary of ``vocab_size`` when it is
    known (one recorded from another model is not)."""
    response = getattr(record, "response_token_ids", None)
    problem = recorded_tokens_problem(getattr(record, "prompt_token_ids", None), response,
                                      getattr(record, "logprobs", None), vocab_size)
    if problem:
        return problem
    top = getattr(record, "top_logprobs", None)
    if top_k > 0 and (top is None or len(top) != len(response) or any(not t for t in top)):
        return "no_topk"
    if top is not None and not all(isinstance(t, list) and all(_top_pair(p, vocab_size) for p in t) for t in top):
        return "bad_tokens"
    return None


def _top_pair(pair: Any, vocab_size: int | None) -> bool:
    return isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], int) \
        and not isinstance(pair[0], bool) and 0 <= pair[0] < (vocab_size or math.inf)


def judged_dispatch(meta: dict[str, Any]) -> Any:
    """The dispatch a computed report's metadata records (the judge's vote and hints), or None when
    it is not one the judge could have written (any client may post metadata under this key)."""
    vote = meta.get("eval_score", 0)
    hints = meta.get("hints") or []
    if isinstance(vote, bool) or vote not in (-1, 0, 1) or not isinstance(hints, list):
        return None
    return dispatch(int(vote), [h[:MAX_HINT_CHARS] for h in hints if isinstance(h, str)])


class TurnProcessor:
    """Sessions, judging and computed reports of one scenario.

    ``store_report(scenario, references, score=, feedback=, metadata=, report_id=)`` stores a
    report and tells the learning loop (``Reef.store_report``); it is blocking and runs in a
    thread. ``judge`` is a ``Judge`` or None (correlate only).
    """

    def __init__(self, scenario: str, options: ProcessorOptions, judge: Any, store_report: Any,
                 state_dir: Path | None = None):
        self.scenario = scenario
        self.options = options
        self.judge = judge
        self.store_report = store_report
        self.sessions = SessionIndex(options.session_ttl_s, options.max_open_sessions,
                                     options.main_turn_requires_tools)
        self.counters = DispatchCounters()
        self.turns_file = Path(state_dir) / "turns.jsonl" if state_dir is not None else None
        self._semaphore = asyncio.Semaphore(max(int(options.prm_concurrency), 1))
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ intake (event loop)

    def ingest(self, record: Any, now: float | None = None) -> list[BoundTurn]:
        """Take a stored record; start judging the turns it binds. Returns them (for tests)."""
        obs = self.sessions.observe(record, now if now is not None else time.time())
        if obs.dropped:
            self.counters.add(obs.dropped)
        if obs.expired:
            self.counters.add("expired", len(obs.expired))
        for bound in obs.bound:
            self.counters.add("bound")
            problem = capture_problem(bound.turn.record, self.options.top_k)
            if problem is not None:
                self.counters.add(problem)
                continue
            if self.judge is None:
                self.counters.add("not_judged")
                continue
            task = asyncio.get_running_loop().create_task(self._judge(bound),
                                                          name=f"reef-openclaw-judge-{bound.turn.record_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return obs.bound

    def expire(self, now: float | None = None) -> int:
        """Close idle sessions (their last turns never train); how many turns expired."""
        gone = self.sessions.expire(now if now is not None else time.time())
        if gone:
            self.counters.add("expired", len(gone))
        return len(gone)

    async def drain(self) -> None:
        """Wait for the turns being judged now."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self.judge is not None:
            await self.judge.aclose()

    def snapshot(self) -> dict[str, int]:
        """Counters since start: dispatch outcomes and why other turns never got there."""
        return {**self.counters.snapshot(), "open_sessions": len(self.sessions)}

    # ------------------------------------------------------------------ judging (background)

    async def _judge(self, bound: BoundTurn) -> None:
        o = self.options
        try:
            async with self._semaphore:
                result = await judge_turn(self.judge, bound, m=o.prm_m, temperature=o.prm_temperature,
                                          max_tokens=o.prm_max_tokens, timeout_s=o.prm_timeout_s,
                                          max_hint_candidates=o.prm_max_hint_candidates)
            await asyncio.to_thread(self.settle, bound, result)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.counters.add("judge_error")
            log.exception("openclaw: judging turn %s of scenario %s failed", bound.turn.record_id, self.scenario)

    def settle(self, bound: BoundTurn, result: JudgeResult) -> dict[str, Any]:
        """Dispatch a judged turn: count it, log it, and store a computed report when it trains.
        Returns the turn's entry (what ``turns.jsonl`` and the report's metadata hold)."""
        d = dispatch(result.eval_score, result.hints)
        self.counters.add(d.outcome)
        entry = {"record_id": bound.turn.record_id, "session": bound.turn.session,
                 "next_state": {"role": bound.next_state.role, "text": bound.next_state.text,
                                "record_id": bound.next_state.record_id},
                 **result.to_dict(), "dispatch": d.outcome, "reward": d.reward}
        self._log_turn(entry)
        if d.trains:
            self.store_report(self.scenario, [bound.turn.record_id], score=d.reward,
                              feedback={"next_state": entry["next_state"]},
                              metadata={METADATA_KEY: entry}, report_id=REPORT_PREFIX + bound.turn.record_id)
        return entry

    def _log_turn(self, entry: dict[str, Any]) -> None:
        if self.turns_file is None:
            return
        line = json.dumps({"at": time.time(), "scenario": self.scenario, **entry}, ensure_ascii=False)
        try:
            with self._lock:
                self.turns_file.parent.mkdir(parents=True, exist_ok=True)
                with self.turns_file.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
        except OSError:
            log.warning("openclaw: could not append to %s", self.turns_file, exc_info=True)
