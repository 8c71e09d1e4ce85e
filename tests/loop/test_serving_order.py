"""The serving table never goes back along a scenario's chain: a swap to a release read as the
head before a newer one was swapped in (the follower, a lease holder's ``serve_head``) is stale."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reef_core.builtins.git_store import GitArtifactStore
from reef_core.commit.serving import ServingReleases
from reef_core.store import RecordStore


class GatedRuntime:
    """Activates instantly, except while ``hold`` is set: then it waits for ``go``."""

    def __init__(self):
        self.hold = False
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        self.activated: list[str] = []

    async def activate(self, release):
        if self.hold:
            self.entered.set()
            await self.go.wait()
        self.activated.append(release.release_id)


def _artifact(root: Path, rules: str) -> Path:
    (root / "harness").mkdir(parents=True, exist_ok=True)
    (root / "harness" / "rules.md").write_text(rules)
    return root


async def test_serve_head_read_before_a_rollback_swapped_in_does_not_swap_it_back(tmp_path):
    """A growth step's ``serve_head`` read the database's head (r2) while a rollback published r3
    and was swapping it in: it then swapped r2 back in and announced it as published, and the
    scenario served a release behind its chain's head until the follower's next round."""
    records = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    runtime = GatedRuntime()
    announced: list[str] = []
    releases = ServingReleases(artifacts=GitArtifactStore(state_dir=tmp_path), store=records, runtime=runtime,
                               state_dir=tmp_path, on_published=lambda row: announced.append(row.release_id))
    try:
        await releases.start(follow=False)
        chain = releases.chain
        r1 = await releases.activate(chain.publish("s", _artifact(tmp_path / "a1", "one"), expected_head=None))
        r2 = await releases.activate(chain.publish("s", _artifact(tmp_path / "a2", "two"),
                                                   expected_head=r1.release_id))
        runtime.hold = True
        rollback = asyncio.create_task(releases.rollback("s", r1.release_id))
        await asyncio.wait_for(runtime.entered.wait(), 30)  # r3 published, being swapped in, not yet recorded
        assert records.head_release("s").release_id == r2.release_id
        stale = asyncio.create_task(releases.serve_head("s"))
        await asyncio.sleep(0.2)  # it read r2 as the head and waits for the swap in progress
        runtime.go.set()
        r3 = (await rollback).release
        await stale
        assert records.head_release("s").release_id == r3.release_id
        assert releases.serving("s").release_id == r3.release_id
        assert runtime.activated[-1] == r3.release_id
        assert announced == [r1.release_id, r2.release_id, r3.release_id]
    finally:
        await releases.stop()
        records.close()
