"""The gate: run an evaluator on a candidate, fail-closed.

Whatever goes wrong while evaluating — an exception in ``evaluate`` or ``decide``, a timeout,
an answer that is not a ``Decision`` — becomes the decision ``error`` with the reason
recorded, and nothing is published: the current release keeps serving.

Evaluators run in a daemon thread. They reach the model through ``EvalContext.complete``,
which runs the runtime call on the server's event loop (where the runtime's connections
live) and gives up when the gate's deadline has passed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from ..errors import ReefError
from ..types import ActiveRelease, Candidate, Decision, Evaluation, InferenceCall, Outcome, base_release

log = logging.getLogger("reef.commit")

#: the outcomes a ``Decision`` may have (``reef_core.types.Outcome``)
OUTCOMES = get_args(Outcome)


#: why a model call of an evaluation (or of a recipe's step) was refused or cut
_CANCELLED = "the evaluation was stopped: its time is up, or the server is stopping"
#: how often a model call waiting for its answer looks at ``EvalContext.cancelled`` (seconds)
_CANCEL_POLL_S = 0.25


class EvaluationCancelled(ReefError):
    """The gate stopped waiting for this evaluation (timeout or shutdown)."""


@dataclass
class EvalContext:
    """What an evaluator gets besides the candidate and the current release.

    ``store`` is the record store (read it, never write), None when the context was built
    without one (unit tests). ``serving_params`` and ``training_prompts`` are for contexts
    built by hand: when None, ``task_suite`` works them out from ``store`` (the sampling
    fields recent requests of the scenario used; the user texts of the candidate's batch).
    """

    scenario: str
    runtime: Any
    loop: asyncio.AbstractEventLoop
    apply_harness: Callable[[dict[str, Any], str, ActiveRelease], dict[str, Any]] | None
    log: logging.Logger
    progress: Any
    default_model: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None
    graders: dict[str, Callable[..., float]] = field(default_factory=dict)
    store: Any = None
    serving_params: dict[str, Any] | None = None
    training_prompts: frozenset[str] | None = None

    @property
    def dialect(self) -> str:
        """The dialect of the bodies ``complete`` takes and returns: the runtime's, or Chat
        Completions before a Responses runtime (``send`` translates both ways, as the server does
        for a Chat Completions client), so evaluators and recipes need not speak the Responses API."""
        return "openai" if self.runtime.dialect == "responses" else self.runtime.dialect

    def complete(self, body: dict[str, Any], release: ActiveRelease | None, *,
                 timeout_s: float | None = None) -> dict[str, Any]:
        """Answer ``body`` (in the runtime's dialect) with ``release``'s harness applied.

        Blocks the calling (evaluator) thread; raises EvaluationCancelled once the gate gave
        up, ``TimeoutError`` after ``timeout_s``, or whatever the runtime raised.
        """
        return self.send(self.prepare(body, release), release, timeout_s=timeout_s)

    def prepare(self, body: dict[str, Any], release: ActiveRelease | None) -> dict[str, Any]:
        """``body`` as the runtime will get it: with ``release``'s harness applied."""
        if release is not None and self.apply_harness is not None:
            return self.apply_harness(body, self.dialect, release)
        return body

    def send(self, prepared: dict[str, Any], release: ActiveRelease | None, *,
             timeout_s: float | None = None) -> dict[str, Any]:
        """Answer a body ``prepare`` returned, as is (``complete`` without the harness step)."""
        if self.cancelled.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline):
            raise EvaluationCancelled(_CANCELLED)
        call = InferenceCall(scenario=self.scenario, record_id=f"eval_{uuid.uuid4().hex}", body=prepared,
                             dialect=self.dialect, release=release or base_release(self.scenario))
        limit = timeout_s
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0.0)
            limit = left if limit is None else min(limit, left)
        if self.runtime.dialect != self.dialect:
            from ..serve.dialects import translate_request, translate_response

            call = replace(call, body=translate_request(prepared, self.dialect, self.runtime.dialect),
                           dialect=self.runtime.dialect)
        future = asyncio.run_coroutine_threadsafe(self.runtime.complete(call), self.loop)
        try:
            answer = self._wait(future, limit)
            if self.runtime.dialect != self.dialect:
                return translate_response(answer, self.runtime.dialect, self.dialect)
            return answer
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"model call took longer than {limit:.0f}s") from None

    def _wait(self, future: concurrent.futures.Future, limit: float | None) -> Any:
        """``future``'s result within ``limit`` seconds, looking at ``cancelled`` meanwhile: a
        server that stops mid-evaluation (or a gate that gave up) does not wait for a long
        generation to end. ``concurrent.futures.TimeoutError`` past ``limit``."""
        end = None if limit is None else time.monotonic() + limit
        while True:
            left = None if end is None else max(end - time.monotonic(), 0.0)
            try:
                return future.result(timeout=_CANCEL_POLL_S if left is None else min(left, _CANCEL_POLL_S))
            except concurrent.futures.TimeoutError:
                if self.cancelled.is_set():
                    future.cancel()
                    raise EvaluationCancelled(_CANCELLED) from None
                if left is not None and left <= _CANCEL_POLL_S:
                    raise


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists, tuples and dicts too) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _finite_evaluation(evaluation: Evaluation) -> Evaluation:
    """``evaluation`` as it is stored, answered and published: JSON has no NaN or infinity (an
    evaluator's NaN mean or spread made the grow route, the candidates and the releases answer
    500), so each becomes None, as a stored episode's score does."""
    evaluation.candidate_scores = finite(list(evaluation.candidate_scores or []))
    evaluation.current_scores = finite(list(evaluation.current_scores or []))
    evaluation.metrics = finite(dict(evaluation.metrics or {}))
    return evaluation


def run_gate(evaluator: Any, name: str, candidate: Candidate, current: ActiveRelease | None,
             ctx: EvalContext, timeout_s: float) -> tuple[Evaluation, Decision]:
    """Evaluate and decide within ``timeout_s``; never raises. Blocking: call from a thread.
    The evaluation comes back with its NaN and infinite numbers as None (``_finite_evaluation``)."""
    evaluation, decision = _run_gate(evaluator, name, candidate, current, ctx, timeout_s)
    return _finite_evaluation(evaluation), decision


def _run_gate(evaluator: Any, name: str, candidate: Candidate, current: ActiveRelease | None,
              ctx: EvalContext, timeout_s: float) -> tuple[Evaluation, Decision]:
    ctx.deadline = time.monotonic() + timeout_s
    result: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            evaluation = evaluator.evaluate(candidate, current, ctx)
            if not isinstance(evaluation, Evaluation):
                raise TypeError(f"evaluate returned {type(evaluation).__name__}, not an Evaluation")
            result["evaluation"] = evaluation
            decision = evaluator.decide(evaluation)
            if not isinstance(decision, Decision) or decision.outcome not in OUTCOMES:
                raise TypeError(f"decide returned {decision!r}, not a Decision({'|'.join(OUTCOMES)})")
            result["decision"] = decision
        except BaseException as exc:  # noqa: BLE001 - fail-closed: every failure rejects the candidate
            result["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=work, name=f"reef-eval-{candidate.id}", daemon=True)
    thread.start()
    finished = done.wait(timeout_s)
    # Episodes cut short by the deadline make an evaluation that "finished" just in time: it
    # measured nothing trustworthy, so it counts as timed out too.
    if not finished or time.monotonic() >= ctx.deadline:
        ctx.cancelled.set()
        reason = f"evaluation timed out after {timeout_s:g}s"
        log.warning("candidate %s: %s; rejected", candidate.id, reason)
        partial = result.get("evaluation")
        evaluation = partial or Evaluation(evaluator=name)
        evaluation.error = reason
        return evaluation, Decision("error", reason)
    if "error" in result:
        exc = result["error"]
        reason = f"evaluator {name!r} failed: {type(exc).__name__}: {exc}"
        log.warning("candidate %s: %s; rejected", candidate.id, reason)
        evaluation = result.get("evaluation") or Evaluation(evaluator=name)
        evaluation.error = reason
        return evaluation, Decision("error", reason)
    evaluation, decision = result["evaluation"], result["decision"]
    if evaluation.error and decision.outcome == "select":
        reason = f"evaluator {name!r} reported an error but selected: {evaluation.error}"
        return evaluation, Decision("error", reason)
    return evaluation, decision
