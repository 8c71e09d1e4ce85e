"""The store's JSON columns: orjson's encoding, the standard library for what orjson refuses."""

from __future__ import annotations

import json

import pytest

from reef_core.store import Record, RecordStore, new_id
from reef_core.store.engine import json_serializer


def test_encoding_is_compact_json_and_falls_back_for_big_integers():
    text = json_serializer({"a": [1, 2.5, float("nan"), float("inf")], "é": "ü", 3: None})
    assert json.loads(text) == {"a": [1, 2.5, None, None], "é": "ü", "3": None}
    assert "NaN" not in text and "Infinity" not in text
    big = {"x": 2**70}
    assert json.loads(json_serializer(big)) == big
    with pytest.raises(TypeError):
        json_serializer({"x": object()})


def test_ids_are_prefixed_random_hex():
    ids = {new_id("rcpt") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("rcpt_") and len(i) == 37 and int(i[5:], 16) >= 0 for i in ids)


def test_records_round_trip_through_the_store(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    receipt = new_id("rcpt")
    request = {"messages": [{"role": "user", "content": "naïve café \u2603"}], "n": 2**70, "t": 0.5}
    store.add_records([Record(id=receipt, scenario="s", route="openai.chat", request=request,
                              response={"choices": [], "x": float("nan")})])
    got = store.get_records([receipt])[receipt]
    assert got.request == request and got.response == {"choices": [], "x": None}
    store.close()
