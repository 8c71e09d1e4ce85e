"""``Reef.store_report``: a plugin that computes feedback from traffic stores it as the report
route does — idempotent by id, references checked, observers told once."""

from __future__ import annotations

import pytest

from reef_core import ConflictError, NotFoundError, hookimpl
from reef_core.testing import FakeUpstream, ReefServer


class Recorder:
    def __init__(self):
        self.reports = []

    @hookimpl
    def report_stored(self, report):
        self.reports.append(report)


def test_store_report_is_the_report_route_for_plugins(tmp_path):
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up, learning=False) as reef:
        r = reef.client().post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        receipt = r.headers["x-reef-agent-record-id"]
        recorder = Recorder()
        reef.reef.register(recorder)
        kernel = reef.reef
        report, created = kernel.store_report("default", [receipt], score=-1.0, feedback={"next_state": "no"},
                                              metadata={"source": "computed"}, report_id="computed_1")
        assert created and report.id == "computed_1" and report.references == (receipt,)
        again, created = kernel.store_report("default", [receipt], score=-1.0, feedback={"next_state": "no"},
                                             metadata={"source": "computed"}, report_id="computed_1")
        assert not created and again.id == "computed_1"
        assert [x.id for x in recorder.reports] == ["computed_1"]            # observers hear it once
        with pytest.raises(ConflictError):
            kernel.store_report("default", [receipt], score=1.0, report_id="computed_1")
        with pytest.raises(NotFoundError):
            kernel.store_report("default", ["rec_missing"], score=1.0)
        stored = reef.store.get_report("computed_1")
        assert (stored.score, stored.meta, stored.feedback) == (-1.0, {"source": "computed"}, {"next_state": "no"})
