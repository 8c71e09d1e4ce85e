"""Upstream errors, broken streams and disconnects: the right answer, a record, and a live server."""

from __future__ import annotations

import socket
import time

import anthropic
import httpx
import openai
import pytest

from reef_core.testing import FakeUpstream, ReefServer, parse_sse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two three four five six"}]}
MSG = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "one two three four five six"}]}




def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("route,body,shape", [("/v1/chat/completions", CHAT, "openai"),
                                              ("/v1/messages", MSG, "anthropic")])
def test_upstream_unreachable_502_and_error_record(tmp_path, route, body, shape):
    with ReefServer(tmp_path, upstream=f"http://127.0.0.1:{_free_port()}", dialect="openai") as reef:
        for streamed in (False, True):
            r = reef.client().post(route, json={**body, "stream": streamed})
            assert r.status_code == 502
            err = r.json()
            if shape == "openai":
                assert "unreachable" in err["error"]["message"]
            else:
                assert err["type"] == "error" and "unreachable" in err["error"]["message"]
            rec = reef.store.get_record(r.headers["x-reef-agent-record-id"])
            assert rec.status == "error" and "unreachable" in rec.error
        assert reef.client().get("/healthz").json() == {"ok": True}


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
@pytest.mark.parametrize("status", [400, 429, 503])
def test_upstream_error_relayed_with_status_and_message(reefs, upstreams, upstream, status):
    up, reef = upstreams[upstream], reefs[upstream]
    up.fail(status, "quota says no", times=2)
    with pytest.raises(openai.APIStatusError) as oe:
        reef.openai().chat.completions.create(**CHAT)
    assert oe.value.status_code == status and "quota says no" in str(oe.value)
    with pytest.raises(anthropic.APIStatusError) as ae:
        reef.anthropic().messages.create(**MSG, stream=True)
    assert ae.value.status_code == status and "quota says no" in str(ae.value)
    for rid in (oe.value.response.headers["x-reef-agent-record-id"],
                ae.value.response.headers["x-reef-agent-record-id"]):
        rec = reef.store.get_record(rid)
        assert rec.status == "error" and "quota says no" in rec.error


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
@pytest.mark.parametrize("route,body", [("/v1/chat/completions", CHAT), ("/v1/messages", MSG)])
def test_upstream_stream_cut_leaves_incomplete_record(reefs, upstreams, upstream, route, body):
    up, reef = upstreams[upstream], reefs[upstream]
    up.cut_stream(after_events=4)
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 200
    events = parse_sse(r.text)
    last = events[-1][1]
    assert "error" in last  # the client learns the stream broke, in its own dialect
    rec = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert rec.status == "incomplete" and rec.error
    assert rec.response is not None  # what arrived before the cut
    ok = reef.client().post(route, json=body)
    assert ok.status_code == 200


def test_upstream_stream_ending_early_is_incomplete(reefs, upstreams):
    upstreams["anthropic"].end_stream_early(after_events=3)
    with pytest.raises(anthropic.APIError):
        with reefs["anthropic"].anthropic().messages.stream(**MSG) as s:
            receipt = s.response.headers["x-reef-agent-record-id"]
            s.get_final_message()
    rec = reefs["anthropic"].wait_record(receipt)
    assert rec.status == "incomplete" and "final event" in rec.error


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
@pytest.mark.parametrize("route,body", [("/v1/chat/completions", CHAT), ("/v1/messages", MSG)])
def test_client_disconnect_mid_stream_leaves_incomplete_record(reefs, upstreams, upstream, route, body):
    up, reef = upstreams[upstream], reefs[upstream]
    up.stall_stream(after_events=3)
    with httpx.Client(base_url=reef.url, timeout=10) as c:
        with c.stream("POST", route, json={**body, "stream": True}) as r:
            receipt = r.headers["x-reef-agent-record-id"]
            next(r.iter_bytes())  # some events arrived; now the client goes away
    rec = reef.wait_record(receipt)
    up.release()
    assert rec.status == "incomplete"
    assert "disconnected" in rec.error
    assert reef.client().post(route, json=body).status_code == 200


def test_a_client_that_leaves_a_non_streamed_answer_cancels_it(tmp_path):
    """The client of a non-streamed request gives up while the upstream still works: the
    upstream request is cancelled and the record says the client left (as for a stream)."""
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as reef:
        up.hang(times=1)
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=reef.url, timeout=0.5) as c:
            c.post("/v1/chat/completions", json=CHAT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records = reef.client().get("/reef/scenarios/default/records", params={"limit": 5}).json()["records"]
            if records:
                break
            time.sleep(0.05)
        up.release()
        [rec] = records
        assert rec["status"] == "incomplete" and "client disconnected" in rec["error"]
        assert reef.client().post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_receipt_still_streaming_is_a_409_to_retry_not_unknown(reefs, upstreams):
    """A stream's receipt goes out with its headers; its record is stored when the stream ends.
    A report or read quoting it meanwhile is told to retry then (409), not that it is unknown."""
    up, reef = upstreams["openai"], reefs["openai"]
    up.stall_stream(after_events=2)
    with httpx.Client(base_url=reef.url, timeout=10) as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            receipt = r.headers["x-reef-agent-record-id"]
            chunks = r.iter_bytes()
            next(chunks)
            early = c.post("/reef/report", json={"score": 1.0, "references": [receipt]})
            read = c.get(f"/reef/records/{receipt}")
            up.release()
            for _ in chunks:
                pass
        assert early.status_code == read.status_code == 409
        assert "still streaming" in early.json()["error"]["message"]
        reef.wait_record(receipt)
        assert c.post("/reef/report", json={"score": 1.0, "references": [receipt]}).status_code == 200
        assert c.post("/reef/report", json={"score": 1.0, "references": ["rec_unknown"]}).status_code == 404


def test_upstream_timeout_is_502_and_server_keeps_serving(tmp_path):
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up,
                                                  overrides=["runtime.timeout_s=0.3"]) as reef:
        up.hang(times=1)
        r = reef.client().post("/v1/chat/completions", json=CHAT)
        up.release()
        assert r.status_code == 502 and "timed out" in r.json()["error"]["message"]
        assert reef.store.get_record(r.headers["x-reef-agent-record-id"]).status == "error"
        assert reef.client().post("/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.parametrize("streamed", [False, True])
def test_store_failure_withholds_the_answer(tmp_path, streamed):
    """No durable record, no receipt: the client gets an error instead of an unrecorded answer."""
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as reef:
        def broken(records):
            raise RuntimeError("disk full")

        reef.store.add_records = broken
        r = reef.client().post("/v1/chat/completions", json={**CHAT, "stream": streamed})
        if streamed:
            events = parse_sse(r.text)
            assert "error" in events[-1][1] and "recorded durably" in events[-1][1]["error"]["message"]
            assert not any(isinstance(d, dict) and "reef" in d for _, d in events)
        else:
            assert r.status_code == 503 and "recorded durably" in r.json()["error"]["message"]
            assert "x-reef-agent-record-id" not in r.headers  # no receipt for a record that does not exist
        text = reef.client().get("/metrics").text
        assert "reef_record_write_failures_total 1.0" in text


def test_an_error_whose_record_could_not_be_stored_carries_no_receipt(tmp_path):
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as reef:
        def broken(records):
            raise RuntimeError("disk full")

        reef.store.add_records = broken
        up.fail(429, "slow down")
        r = reef.client().post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 429 and "slow down" in r.json()["error"]["message"]
        assert "x-reef-agent-record-id" not in r.headers


@pytest.mark.parametrize("route,body", [("/v1/chat/completions", CHAT), ("/v1/messages", MSG)])
def test_client_gone_before_the_first_event_leaves_incomplete_record(reefs, upstreams, route, body):
    up, reef = upstreams["openai"], reefs["openai"]
    before = {r.id for r in reef.store.list_records("default", limit=None)}
    up.stall_stream(after_events=0)  # headers upstream, then nothing: Reef has not answered yet
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{reef.url}{route}", json={**body, "stream": True}, timeout=httpx.Timeout(5, read=0.3))
    up.release()  # the upstream goes on; Reef answers a client that has left
    deadline = time.monotonic() + 10
    new = []
    while time.monotonic() < deadline and not new:
        new = [r for r in reef.store.list_records("default", limit=None) if r.id not in before]
        time.sleep(0.02)
    assert len(new) == 1
    assert new[0].status == "incomplete" and "disconnected" in new[0].error
