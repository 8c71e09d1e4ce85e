"""A release published and served here whose database row could not be written (the database
away for a moment) is recorded by the follower once the database answers, and announced then:
before, the follower skipped the head this process served, so the table lagged the store (and a
growth step's candidate stayed ``selected``) until the next growth step or a restart."""

from __future__ import annotations

import contextvars

from reef_core.commit import serving as serving_module
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import wait_for
from .test_rollback_polish import _publish_rule


def test_a_release_row_that_failed_to_write_is_written_by_the_follower(tmp_path, monkeypatch):
    monkeypatch.setattr(serving_module, "FOLLOW_INTERVAL_S", 0.05)
    state = tmp_path / "state"
    state.mkdir()
    first = _publish_rule(state, tmp_path)
    with FakeUpstream("openai") as up, ReefServer(state, upstream=up, learning=False) as server:
        client = server.client()
        store = server.reef.store
        real = store.add_release
        calls = []
        # the publisher's own write fails once; the follower may write the row first (it records
        # what it finds in the store, idempotently), so the failure is the publisher's, not the first call's
        publishing = contextvars.ContextVar("publishing", default=False)
        activate = server.reef.releases.activate

        async def publisher(stored):
            publishing.set(True)  # asyncio.to_thread carries it into the thread that writes the row
            return await activate(stored)

        def flaky(row):
            calls.append((row.release_id, publishing.get()))
            if publishing.get() and calls.count((row.release_id, True)) == 1:
                raise ConnectionError("the database went away")
            return real(row)

        monkeypatch.setattr(server.reef.releases, "activate", publisher)
        monkeypatch.setattr(store, "add_release", flaky)
        announced = []
        told = server.reef.releases._on_published
        monkeypatch.setattr(server.reef.releases, "_on_published", lambda row: (announced.append(row.release_id),
                                                                                 told(row)))
        r = client.post("/reef/scenarios/default/rollback", json={"to": "base"})
        assert r.status_code == 500, r.text
        pushed = server.reef.releases.artifacts.head("default")
        assert pushed.release_id != first.release_id  # published in the store, and served
        assert server.reef.serving_release("default").release_id == pushed.release_id
        wait_for(lambda: store.head_release("default").release_id == pushed.release_id,
                 "the follower recording the release the database missed")
        wait_for(lambda: announced == [pushed.release_id], "the release announced once")
        assert [r["release_id"] for r in client.get("/reef/scenarios/default/releases").json()["releases"]] == [
            pushed.release_id, first.release_id]
