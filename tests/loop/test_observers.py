"""Observer hooks hand plugins read-only values, never the store's rows: a plugin registered for
the four observer hooks sees frozen copies, and what it tries to change stays as stored."""

from __future__ import annotations

import dataclasses

from reef_core import Candidate, Decision, Evaluation, ExperienceRecord, PublishedRelease, StoredReport, hookimpl
from reef_core.plugins import get_plugins
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import GOOD_FEEDBACK, ask, capital_model, feedback_rules_config, report, settings_for, wait_for


def _refused(change) -> bool:
    try:
        change()
    except (dataclasses.FrozenInstanceError, TypeError, AttributeError):
        return True
    return False


class Observer:
    """Keeps what each observer hook received, and whether changing it was refused."""

    def __init__(self):
        self.seen: dict[str, list] = {"record": [], "report": [], "candidate": [], "release": []}

    @hookimpl
    def record_stored(self, record):
        refused = _refused(lambda: setattr(record, "status", "tampered"))
        self.seen["record"].append((record, refused))

    @hookimpl
    def report_stored(self, report):
        refused = _refused(lambda: setattr(report, "score", 1.0)) and _refused(lambda: report.references.append("r"))
        self.seen["report"].append((report, refused))

    @hookimpl
    def candidate_evaluated(self, candidate, evaluation, decision):
        candidate.summary = "changed by an observer"  # a copy: the kernel's candidate is untouched
        evaluation.metrics["tampered"] = True
        self.seen["candidate"].append((candidate, evaluation, decision, _refused(lambda: setattr(decision, "reason", ""))))

    @hookimpl
    def release_published(self, release):
        refused = _refused(lambda: setattr(release, "release_id", "r-other")) and \
            _refused(lambda: release.evaluation.__setitem__("x", 1))
        self.seen["release"].append((release, refused))


def test_a_plugin_observes_frozen_values_and_cannot_change_what_is_stored(tmp_path):
    observer = Observer()
    get_plugins().pm.register(observer, name="test-observer")  # the plugin set is per test (tests/conftest.py)
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                   evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            receipt = ask(client, "What is the capital of Italy?").headers["x-reef-agent-record-id"]
            report(client, [receipt], score=0.0, feedback=GOOD_FEEDBACK)
            step = client.post("/reef/scenarios/default/grow").json()
            assert step["outcome"] == "published", step
            wait_for(lambda: observer.seen["record"], "record_stored")

            [(record, refused)] = observer.seen["record"]
            assert type(record) is ExperienceRecord and refused
            assert record.id == receipt and record.scenario == "default" and record.status == "ok"

            [(stored_report, refused)] = observer.seen["report"]
            assert type(stored_report) is StoredReport and refused
            assert stored_report.references == (receipt,) and stored_report.feedback == GOOD_FEEDBACK

            [(candidate, evaluation, decision, refused)] = observer.seen["candidate"]
            assert (type(candidate), type(evaluation), type(decision)) == (Candidate, Evaluation, Decision) and refused
            assert candidate.id == step["candidate_id"] and decision.outcome == "select"

            [(release, refused)] = observer.seen["release"]
            assert type(release) is PublishedRelease and release.evaluation is not None and refused
            assert (release.release_id, release.candidate_id, release.operation) == \
                (step["release_id"], step["candidate_id"], "train")

            assert server.store.get_record(receipt).status == "ok"
            [row] = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            assert row["summary"] != "changed by an observer" and "tampered" not in row["evaluation"]["metrics"]
            assert client.get("/reef/scenarios/default/releases").json()["serving_release_id"] == step["release_id"]
