"""``ScenarioWorker.grow_now`` against an automatic trigger: an eligibility check that is still
running is waited for, a step that is running answers ``busy`` (the store, the lease and the
step itself are test doubles: only the worker's own coordination is under test)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import SimpleNamespace

import pytest

from reef_core.grow import worker as worker_mod
from reef_core.grow.lease import Holding
from reef_core.grow.step import StepResult


class _Leases:
    @contextlib.asynccontextmanager
    async def hold(self, scenario, wait_s=0.0):
        yield Holding(scenario=scenario, holder="here", token=1)


class _Releases:
    chain = None

    async def serve_head(self, scenario):
        return None


def _worker(monkeypatch, *, due: bool, step_gate: asyncio.Event | None = None):
    """A worker whose eligibility check blocks until ``release`` is set, then says ``due``."""
    release, checking = threading.Event(), threading.Event()
    steps: list[str] = []

    def auto_step_due(reef, plan):
        checking.set()
        assert release.wait(10)
        return due

    async def run_step(reef, plan, trigger, progress, lease=None):
        steps.append(trigger)
        if step_gate is not None:
            await step_gate.wait()
        return StepResult(scenario=plan.scenario, trigger=trigger, outcome="published")

    monkeypatch.setattr(worker_mod, "auto_step_due", auto_step_due)
    monkeypatch.setattr(worker_mod, "run_step", run_step)
    monkeypatch.setattr(worker_mod, "settle_ended_steps", lambda chain, store, scenario, token, max_attempts: ([], []))
    reef = SimpleNamespace(store=None, releases=_Releases(),
                           settings=SimpleNamespace(loop=SimpleNamespace(max_attempts=3, lease_poll_s=2)))
    worker = worker_mod.ScenarioWorker(reef, "s", lambda name: SimpleNamespace(scenario=name), _Leases())
    return worker, release, checking, steps


async def _during_the_check(worker, checking, release):
    auto = asyncio.create_task(worker.step("auto"))
    assert await asyncio.to_thread(checking.wait, 10)
    assert worker.lock.locked()
    manual = asyncio.create_task(worker.grow_now(progress=object()))
    await asyncio.sleep(0.05)
    assert not manual.done()  # waiting for the check's answer, not answering busy
    release.set()
    return auto, manual


def test_a_grow_during_a_check_that_finds_nothing_runs_its_own_step(monkeypatch):
    async def main():
        worker, release, checking, steps = _worker(monkeypatch, due=False)
        auto, manual = await _during_the_check(worker, checking, release)
        assert (await auto).outcome == "nothing"
        assert (await manual).outcome == "published"
        assert steps == ["manual"]

    asyncio.run(main())


def test_a_grow_during_a_check_that_starts_a_step_is_busy(monkeypatch):
    async def main():
        gate = asyncio.Event()
        worker, release, checking, steps = _worker(monkeypatch, due=True, step_gate=gate)
        auto, manual = await _during_the_check(worker, checking, release)
        result = await asyncio.wait_for(manual, 10)
        assert result.outcome == "busy" and "already running" in result.reason
        gate.set()
        assert (await auto).outcome == "published"
        assert steps == ["auto"]

    asyncio.run(main())


@pytest.mark.parametrize("waiting", [2, 3])
def test_only_one_of_several_waiting_grows_runs(monkeypatch, waiting):
    async def main():
        gate = asyncio.Event()
        worker, release, checking, steps = _worker(monkeypatch, due=False, step_gate=gate)
        auto = asyncio.create_task(worker.step("auto"))
        assert await asyncio.to_thread(checking.wait, 10)
        manual = [asyncio.create_task(worker.grow_now(progress=object())) for _ in range(waiting)]
        await asyncio.sleep(0.05)
        release.set()
        assert (await auto).outcome == "nothing"
        await asyncio.sleep(0.05)
        gate.set()
        outcomes = sorted(r.outcome for r in await asyncio.gather(*manual))
        assert outcomes == ["busy"] * (waiting - 1) + ["published"]
        assert steps == ["manual"]

    asyncio.run(main())
