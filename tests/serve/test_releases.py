"""The release serving a scenario is frozen at request start, sent back, recorded, and its
harness is applied to what is sent upstream and recorded."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from reef_core.testing import FakeUpstream, ReefServer, parse_sse, system_prompt
from reef_core.types import ActiveRelease


def _release(tmp_path, release_id: str, system: str) -> ActiveRelease:
    root = tmp_path / release_id
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "system.md").write_text(system)
    return ActiveRelease(scenario="s", release_id=release_id, content_hash=release_id, path=root)


def _in_thread(coro) -> None:
    """Run ``coro`` to completion from inside another event loop (the fake upstream's)."""
    t = threading.Thread(target=asyncio.run, args=(coro,))
    t.start()
    t.join()


@pytest.mark.parametrize("streamed", [False, True])
def test_release_frozen_at_request_start(tmp_path, streamed):
    state = {}

    def responder(body):
        # A new release lands while this request is being answered.
        if "swap" in json.dumps(body):
            _in_thread(state["reef"].reef.releases.serve(state["rel2"]))
        return f"seen: {system_prompt(body)}"

    with FakeUpstream("anthropic", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        state["reef"] = reef
        state["rel2"] = _release(tmp_path, f"rel-2-{streamed}", "Second harness.")
        asyncio.run(reef.reef.releases.serve(_release(tmp_path, f"rel-1-{streamed}", "Be brief.")))
        body = {"model": "m", "messages": [{"role": "user", "content": "please swap"}], "stream": streamed}
        r = reef.client().post("/v1/chat/completions", json=body, headers={"x-reef-scenario": "s"})
        assert r.status_code == 200
        assert r.headers["x-reef-release-id"] == f"rel-1-{streamed}"
        if streamed:
            marker = [d["reef"] for _, d in parse_sse(r.text) if isinstance(d, dict) and "reef" in d][0]
            assert marker["release_id"] == f"rel-1-{streamed}"
        rec = reef.store.get_record(r.headers["x-reef-agent-record-id"])
        assert rec.release_id == f"rel-1-{streamed}"
        # The harness reached the upstream (in its dialect) and the record keeps the prepared body.
        assert "Be brief." in up.requests[-1]["system"]
        assert "Be brief." in json.dumps(rec.request)
        after = reef.client().post("/v1/chat/completions", headers={"x-reef-scenario": "s"},
                                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert after.headers["x-reef-release-id"] == f"rel-2-{streamed}"
        other = reef.client().post("/v1/chat/completions", headers={"x-reef-scenario": "elsewhere"},
                                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert "x-reef-release-id" not in other.headers
