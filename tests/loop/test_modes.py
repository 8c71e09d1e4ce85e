"""Per-scenario learning modes: auto, manual, paused and record_only; their persistence across
restarts; the HTTP API, the CLI (local and against a running server) and scenario-limited tokens."""

from __future__ import annotations

import asyncio
import getpass
import json

import pytest
from click.testing import CliRunner

from reef_core.cli import main
from reef_core.compose import build_reef
from reef_core.errors import ConflictError
from reef_core.plugins import get_plugins
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import (
    GOOD_FEEDBACK,
    ask,
    capital_model,
    feedback_rules_config,
    grow_steps,
    report,
    settings_for,
    wait_for,
    wait_published,
    write_config,
)
from .test_recovery import Down, _seed

ADMIN, OTHER_ADMIN, REPORTER = "tok-admin", "tok-admin-other", "tok-report"
TOKENS = [{"token": ADMIN, "role": "admin"},
          {"token": OTHER_ADMIN, "role": "admin", "scenarios": ["other"]},
          {"token": REPORTER, "role": "report"}]


def _config(mode: str | None = None, **kw):
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"}, **kw)
    if mode is not None:
        config["scenarios"] = {"default": {"mode": mode}}
    return config


def _gate_answers(server: ReefServer, scenario: str = "default") -> list[tuple[bool, int]]:
    """Record each answer of the scenario worker's mode gate (asked before every automatic
    step) with the scenario's stored report count at that moment."""
    lp = server.reef.learning
    wait_for(lambda: scenario in lp.workers, "the start-up wake of the scenario")
    worker = lp.workers[scenario]
    asked = worker.may_grow_auto
    answers: list[tuple[bool, int]] = []

    async def recording() -> bool:
        answer = await asked()
        reports = await asyncio.to_thread(lambda: server.store.counts(scenario)["reports"])
        answers.append((answer, reports))
        return answer

    worker.may_grow_auto = recording
    return answers


def _ask_and_report(client, feedback: str = GOOD_FEEDBACK) -> tuple[str, str]:
    r = ask(client, "What is the capital of Japan?")
    receipt = r.headers["x-reef-agent-record-id"]
    return receipt, report(client, [receipt], score=0.0, feedback=feedback)["report_id"]


def test_manual_grows_only_on_an_explicit_grow(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, _config("manual"))) as server:
            client = server.client()
            answers = _gate_answers(server)
            _ask_and_report(client)
            wait_for(lambda: any(n >= 1 for _, n in answers), "the report's wake")
            assert not any(answer for answer, _ in answers)
            assert server.store.list_candidates("default") == []
            status = client.get("/reef/scenarios/default").json()
            assert status["mode"] == "manual" and status["loop"]["mode"] == "manual"
            assert status["loop"]["eligible"] == 1

            grown = client.post("/reef/scenarios/default/grow")
            assert grown.status_code == 200 and grown.json()["outcome"] == "published", grown.text
            assert ask(client, "What is the capital of Japan?").json()["choices"][0]["message"]["content"] \
                == "The capital is Tokyo."


def test_paused_stores_everything_learns_nothing_and_refuses_grow(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, _config("paused"))) as server:
            client = server.client()
            answers = _gate_answers(server)
            _, report_id = _ask_and_report(client)
            wait_for(lambda: any(n >= 1 for _, n in answers), "the report's wake")
            assert not any(answer for answer, _ in answers)
            counts = server.store.counts("default")
            assert counts["records"] == 1 and counts["reports"] == 1

            refused = client.post("/reef/scenarios/default/grow")
            assert refused.status_code == 409
            message = refused.json()["error"]["message"]
            assert "learning mode 'paused'" in message and "/reef/scenarios/default/mode" in message
            assert server.store.list_candidates("default") == []
            assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 1  # still in the pool

            put = client.put("/reef/scenarios/default/mode", json={"mode": "auto"})
            assert put.status_code == 200 and put.json()["mode"] == "auto"
            wait_published(client, 1)  # becoming auto wakes the worker; the paused report is learned
            assert server.store.consumed([report_id]) == {report_id}


def test_record_only_records_never_become_experience(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, _config("record_only"))) as server:
            client = server.client()
            _, recorded_only = _ask_and_report(client)
            assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 0
            refused = client.post("/reef/scenarios/default/grow")
            assert refused.status_code == 409 and "learning mode 'record_only'" in refused.json()["error"]["message"]

            assert client.put("/reef/scenarios/default/mode", json={"mode": "manual"}).status_code == 200
            assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 0
            nothing = client.post("/reef/scenarios/default/grow").json()
            assert nothing["outcome"] == "nothing", nothing

            _, later = _ask_and_report(client)
            assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 1
            grown = client.post("/reef/scenarios/default/grow").json()
            assert grown["outcome"] == "published", grown
            assert server.store.consumed([recorded_only, later]) == {later}


def test_a_set_mode_survives_restarts_and_wins_over_the_config(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, _config())
        with ReefServer(tmp_path, settings=settings) as server:
            assert server.reef.learning.mode("default") == "auto"
            put = server.client().put("/reef/scenarios/default/mode", json={"mode": "manual"}).json()
            assert put["scenario"] == "default" and put["mode"] == "manual" and put["set_by"] == "api"
            assert put["since"]
        with ReefServer(tmp_path, settings=settings) as server:
            assert server.reef.learning.mode("default") == "manual"
            assert server.client().get("/reef/scenarios/default/mode").json() == put
        paused = settings_for(tmp_path, up, _config("paused"))
        with ReefServer(tmp_path, settings=paused) as server:
            assert server.reef.learning.mode("default") == "manual"  # the stored mode wins
            info = server.reef.learning.set_mode("default", "paused", by="ui")
            assert info["mode"] == "paused" and info["set_by"] == "ui" and info["since"] != put["since"]
            assert server.reef.learning.status("default")["mode"] == "paused"


def test_a_client_names_who_sets_the_mode_within_bounds(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, _config())) as server:
            client = server.client()
            put = client.put("/reef/scenarios/default/mode", json={"mode": "paused", "set_by": "cli:alice"})
            assert put.status_code == 200 and put.json()["set_by"] == "cli:alice"
            for bad in ("", "x" * 101, "cli:\nforged", "tab\there"):
                refused = client.put("/reef/scenarios/default/mode", json={"mode": "auto", "set_by": bad})
                assert refused.status_code == 422, bad
            assert client.get("/reef/scenarios/default/mode").json()["set_by"] == "cli:alice"


def test_a_config_leaving_record_only_across_a_restart_starts_the_pool_then(tmp_path):
    plugins = get_plugins()
    recording = settings_for(tmp_path, Down, _config("record_only", loop_enabled=False))
    reef = build_reef(recording, plugins, background=False)
    assert reef.learning.mode("default") == "record_only"
    _, old_report = _seed(reef.store, "Be brief")
    with pytest.raises(ConflictError, match="learning mode 'record_only'"):
        grow_steps(reef)
    learning = settings_for(tmp_path, Down, _config("auto", loop_enabled=False))
    reef = build_reef(learning, plugins, background=False)
    described = reef.learning.modes.describe("default")
    assert described["mode"] == "auto" and described["set_by"] is None  # still the configuration's
    [step] = grow_steps(reef)
    assert step.outcome == "nothing"
    _, new_report = _seed(reef.store, "Cite sources")
    reef = build_reef(learning, plugins, background=False)
    [step] = grow_steps(reef)
    assert step.outcome == "published"
    assert reef.store.consumed([old_report, new_report]) == {new_report}


def test_the_mode_route_checks_roles_scenarios_and_values(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, {**_config(), "auth": {"tokens": TOKENS}})
        with ReefServer(tmp_path, settings=settings) as server:
            admin, other, reporter = (server.client(t) for t in (ADMIN, OTHER_ADMIN, REPORTER))
            bad = admin.put("/reef/scenarios/default/mode", json={"mode": "sometimes"})
            assert bad.status_code == 422 and "error" in bad.json() and "mode" in bad.json()["error"]["message"]
            assert admin.put("/reef/scenarios/default/mode", json={}).status_code == 422
            unknown = admin.put("/reef/scenarios/nosuch/mode", json={"mode": "paused"})
            assert unknown.status_code == 404 and "nosuch" in unknown.json()["error"]["message"]
            assert other.put("/reef/scenarios/default/mode", json={"mode": "paused"}).status_code == 403
            assert reporter.put("/reef/scenarios/default/mode", json={"mode": "paused"}).status_code == 403
            assert other.get("/reef/scenarios/default/mode").status_code == 403
            assert server.reef.learning.mode("default") == "auto"  # none of those changed it

            ok = admin.put("/reef/scenarios/default/mode", json={"mode": "record_only"})
            assert ok.status_code == 200 and ok.json()["mode"] == "record_only"
            assert reporter.get("/reef/scenarios/default/mode").json()["mode"] == "record_only"
            assert admin.get("/reef/scenarios/default").json()["mode"] == "record_only"


def _cli(tmp_path, *args: str, url: str | None = None):
    cfg = write_config(tmp_path / "cli.yaml", _config(loop_enabled=False))
    remote = ["--url", url, "--token", ADMIN] if url else []
    return CliRunner().invoke(main, [*args, *remote, "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                     f"runtime.upstream_url={Down.url}"])


def test_reef_mode_on_the_state_directory(tmp_path):
    shown = _cli(tmp_path, "mode", "default")
    assert shown.exit_code == 0 and "default: auto (from the configuration)" in shown.output
    bad = _cli(tmp_path, "mode", "default", "sometimes")
    assert bad.exit_code == 2 and "not a learning mode" in bad.output
    set_ = _cli(tmp_path, "mode", "default", "paused", "--json")
    assert set_.exit_code == 0, set_.output
    info = json.loads(set_.output)
    assert info["mode"] == "paused" and info["set_by"].startswith("cli")
    refused = _cli(tmp_path, "grow")
    assert refused.exit_code == 1 and "learning mode 'paused'" in refused.output
    status = _cli(tmp_path, "status", "--json")
    assert status.exit_code == 0, status.output
    [row] = json.loads(status.output[status.output.index("["):])
    assert row["scenario"] == "default" and row["mode"] == "paused"


def test_reef_mode_on_the_state_directory_refuses_what_the_server_refuses(tmp_path):
    """A typo stores no mode for a scenario that does not exist (the server answers 404), a name
    that cannot be a scenario's is a usage error, and a file where the state should be is one line."""
    typo = _cli(tmp_path, "mode", "defualt", "paused")
    assert typo.exit_code == 1 and "no scenario named 'defualt'" in typo.output
    for name in ("", "a/b", "a" * 300):
        assert _cli(tmp_path, "mode", name, "paused").exit_code == 2, name
    assert _cli(tmp_path, "mode", "default").output.strip() == "default: auto (from the configuration)"
    (tmp_path / "file").write_text("")
    cfg = write_config(tmp_path / "cli.yaml", _config(loop_enabled=False))
    for command in ("releases", "status", "lineage"):
        out = CliRunner().invoke(main, [command, "-c", str(cfg), f"server.state_dir={tmp_path / 'file'}",
                                        f"runtime.upstream_url={Down.url}"])
        assert out.exit_code == 2 and out.output.startswith("Error: "), (command, out.output)
        assert "Traceback" not in out.output and f"{tmp_path / 'file'} is a file, not a directory" in out.output


def test_reef_mode_and_status_against_a_running_server(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, {**_config(), "auth": {"tokens": TOKENS}})
        with ReefServer(tmp_path, settings=settings, token=ADMIN) as server:
            set_ = _cli(tmp_path, "mode", "default", "manual", url=server.url)
            assert set_.exit_code == 0, set_.output
            # set from the CLI, so it says so (it said "set by api": the route's label for any client)
            assert "default: manual since" in set_.output and f"set by cli:{getpass.getuser()}" in set_.output
            assert server.client().get("/reef/scenarios/default/mode").json()["set_by"] == f"cli:{getpass.getuser()}"
            assert server.reef.learning.mode("default") == "manual"
            _, _ = _ask_and_report(server.client())
            assert server.client().post("/reef/scenarios/default/grow").json()["outcome"] == "published"
            status = _cli(tmp_path, "status", "--json", url=server.url)
            assert status.exit_code == 0, status.output
            rows = {r["scenario"]: r for r in json.loads(status.output[status.output.index("["):])}
            assert set(rows) == {"default", "other"}  # "other" is named by a token
            row = rows["default"]
            assert row["mode"] == "manual" and row["serving_release_id"]
            assert rows["other"]["mode"] == "auto" and rows["other"]["last_candidates"] == []
            assert row["last_candidates"][0]["status"] == "published"
            paused = _cli(tmp_path, "mode", "default", "paused", url=server.url)
            assert paused.exit_code == 0
            refused = _cli(tmp_path, "grow", url=server.url)
            assert refused.exit_code == 1 and "learning mode 'paused'" in refused.output


def test_the_mode_store_keeps_since_and_sets_the_watermark_on_leaving_record_only(store_url):
    from reef_core.observe import load_pool
    from reef_core.store import RecordStore, Report, new_id

    store = RecordStore(store_url)
    try:
        assert store.scenario_mode("s") is None and not store.pool_start("s").closed
        _, before = _seed(store, "Be brief", scenario="s")
        first = store.set_scenario_mode("s", "record_only", set_by="api", in_effect="auto")
        again = store.set_scenario_mode("s", "record_only", set_by="ui", in_effect="auto")
        assert again.since == first.since and again.set_by == "ui"  # same mode: only who set it changes
        assert store.pool_start("s").closed and load_pool(store, "s") == []
        _, during = _seed(store, "Cite sources", scenario="s")
        left = store.set_scenario_mode("s", "paused", set_by="api", in_effect="auto")
        assert left.since > first.since and left.pool_after_report_seq is not None
        assert load_pool(store, "s") == []  # before and during record_only: never experience
        _, after = _seed(store, "Answer in French", scenario="s")
        assert [e.report_id for e in load_pool(store, "s")] == [after]
        # a new report quoting what was recorded in record_only is not experience either
        quoted = store.get_report(during).references
        store.add_report(Report(id=new_id("rpt"), scenario="s", score=0.0, feedback="late", references=quoted,
                                body_hash=new_id("h")))
        assert [e.report_id for e in load_pool(store, "s")] == [after]
        # a later change keeps the watermark; other scenarios are untouched
        store.set_scenario_mode("s", "auto", set_by="api", in_effect="auto")
        assert [e.report_id for e in load_pool(store, "s")] == [after]
        _, elsewhere = _seed(store, "Be brief", scenario="t")
        assert [e.report_id for e in load_pool(store, "t")] == [elsewhere]
        assert set(store.scenario_modes()) == {"s"}
    finally:
        store.close()
