"""``reef status`` on a state directory and ``reef doctor``'s checks: each one's ok, warn and
fail, what it says to do, and the exit code."""

from __future__ import annotations

import json
import sys
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from reef_core import doctor
from reef_core.cli import main
from reef_core.store import Record, RecordStore, Report, new_id
from reef_core.testing import FakeUpstream

#: an address nobody listens on
DOWN = "http://127.0.0.1:9"


def _cli(tmp_path: Path, *args: str, upstream: str = DOWN, config: dict[str, Any] | None = None):
    cfg = tmp_path / "reef.yaml"
    cfg.write_text(yaml.safe_dump(config or {"loop": {"enabled": False}}))
    return CliRunner().invoke(main, [*args, "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                     f"runtime.upstream_url={upstream}"])


def _json(output: str) -> Any:
    return json.loads(output[output.index("["):])


class _Settings:
    """The parts of ``Settings`` the checks read."""

    def __init__(self, tmp_path: Path, *, runtime: tuple[str, dict], artifact_store: tuple[str, dict] | None = None,
                 recipe: str = "basic", db: str | None = None):
        self.groups = {"runtime": runtime, "artifact_store": artifact_store or ("git", {"lfs_patterns": ["*.bin"]}),
                       "recipe": (recipe, {})}
        self.state_dir = tmp_path / "state"
        self.record_store_url = db or f"sqlite:///{tmp_path / 'state' / 'reef.db'}"

    def group(self, name: str) -> tuple[str, dict]:
        return self.groups[name]


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_doctor_says_when_the_gate_has_no_tasks_of_the_operators_and_the_fastest_way_to_give_it_some(tmp_path):
    """scripts/serve's gate (evaluator=traffic) draws its tasks from graded reports only."""
    cfg = tmp_path / "reef.yaml"
    cfg.write_text(yaml.safe_dump({"loop": {"enabled": False},
                                   "scenarios": {"mine": {"evaluator_options": {"tasks": _tasks(30)}}}}))
    with FakeUpstream("openai") as up:
        result = CliRunner().invoke(main, ["doctor", "--json", "-c", str(cfg), "recipe=feedback_rules",
                                           "evaluator=traffic", f"server.state_dir={tmp_path / 'state'}",
                                           f"runtime.upstream_url={up.url}"])
    assert result.exit_code == 0, result.output  # a warning: reef serve runs, and publishes nothing without tasks
    checks = {c["name"]: c for c in _json(result.output)}
    gate = checks["gate default"]
    assert gate["status"] == "warn" and "the gate has no tasks of yours" in gate["detail"]
    assert "metadata carries `pattern`" in gate["detail"] and "publishes nothing while there are none" in gate["detail"]
    assert gate["fix"].startswith("fastest: post reports with metadata.pattern") and "evaluator.tasks=" in gate["fix"]
    assert "no tasks of yours" not in checks["gate mine"]["detail"]  # its tasks are the operator's


def test_doctor_fails_on_an_unreachable_upstream_and_says_what_to_do(tmp_path):
    result = _cli(tmp_path, "doctor")
    assert result.exit_code == 1
    assert "runtime upstream" in result.output and "FAIL" in result.output
    assert "start the model server" in result.output
    checks = {c["name"]: c for c in _json(_cli(tmp_path, "doctor", "--json").output)}
    assert set(checks) == {"git", "git-lfs", "database", "runtime upstream", "disk"}
    assert checks["runtime upstream"]["status"] == "fail" and "cannot be reached" in checks["runtime upstream"]["detail"]
    assert checks["database"]["status"] == "ok" and "creates it" in checks["database"]["detail"]


def test_doctor_passes_when_the_upstream_answers(tmp_path):
    with FakeUpstream("openai") as up:
        result = _cli(tmp_path, "doctor", "--json", upstream=up.url)
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in _json(result.output)}
    assert checks["runtime upstream"]["status"] == "ok" and "answers (HTTP" in checks["runtime upstream"]["detail"]
    assert all(c["status"] in ("ok", "warn") for c in checks.values())


def _tasks(n: int) -> list[dict[str, str]]:
    return [{"id": f"t{i}", "prompt": f"Question {i}?", "expected": "yes"} for i in range(n)]


def test_doctor_warns_when_a_gate_cannot_detect_less_than_0_2_and_says_how_many_tasks_would(tmp_path):
    config = {"recipe": {"name": "feedback_rules", "batch_size": 1, "max_score": 0.5, "proposer": None},
              "evaluator": {"name": "task_suite", "tasks": _tasks(10)},
              "scenarios": {"big": {"evaluator_options": {"tasks": _tasks(40)}},
                            "tiny": {"evaluator": "task_suite", "evaluator_options": {"tasks": _tasks(2),
                                                                                      "rule": "sign"}},
                            "judged": {"evaluator": "always"}},
              "loop": {"enabled": False}}
    with FakeUpstream("openai") as up:
        result = _cli(tmp_path, "doctor", "--json", upstream=up.url, config=config)
    assert result.exit_code == 0, result.output  # warnings only
    checks = {c["name"]: c for c in _json(result.output)}
    small = checks["gate default"]
    assert small["status"] == "warn" and "with 10 task(s) × 5 repeat(s), up to 4 round(s), this gate detects +0.21" \
        in small["detail"] and "cannot detect an improvement of less than 0.2" in small["detail"]
    assert small["fix"].startswith("give it 11 tasks or more to detect 0.2")
    assert checks["gate big"]["status"] == "ok" and "with 40 task(s)" in checks["gate big"]["detail"]
    tiny = checks["gate tiny"]
    assert tiny["status"] == "warn" and "the sign test over 2 task(s) can never select" in tiny["detail"]
    assert "gate judged" not in checks  # `always` measures nothing


def test_git_and_git_lfs_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    settings = _Settings(tmp_path, runtime=("upstream", {"upstream_url": DOWN}))
    checks = _by_name(doctor.run_checks(settings, None))
    assert checks["git"].status == "fail" and "apt-get install git" in checks["git"].fix
    assert checks["git-lfs"].status == "warn"  # the basic recipe publishes no binaries
    trains = SimpleNamespace(get=lambda kind, name: SimpleNamespace(update_target="adapter"))
    assert _by_name(doctor.run_checks(settings, trains))["git-lfs"].status == "fail"
    no_lfs = _Settings(tmp_path, runtime=("upstream", {"upstream_url": DOWN}), artifact_store=("git", {}))
    assert "git-lfs" not in _by_name(doctor.run_checks(no_lfs, None))
    elsewhere = _Settings(tmp_path, runtime=("upstream", {"upstream_url": DOWN}), artifact_store=("dirs", {}))
    assert not {"git", "git-lfs"} & set(_by_name(doctor.run_checks(elsewhere, None)))


def test_database_revisions_and_an_unreachable_server(tmp_path):
    from alembic import command

    from reef_core.store.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'reef.db'}"
    RecordStore(url).close()
    assert doctor._database(url).status == "ok"
    store = RecordStore(url, migrate=False)
    with store._writer.begin() as conn:
        cfg = alembic_config(store._writer)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    older = doctor._database(url)
    assert older.status == "warn" and "0004" in older.detail and "migrates it at start" in older.fix
    with store._writer.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00d'")
    store.close()
    newer = doctor._database(url)
    assert newer.status == "fail" and "f00d" in newer.detail and "upgrade Reef" in newer.fix
    down = doctor._database("postgresql+psycopg://reef:secret@127.0.0.1:9/reef")
    assert down.status == "fail" and "cannot connect" in down.detail and "secret" not in down.detail
    assert "REEF_DATABASE_URL" in down.fix


def test_local_runtime_model_and_cache(tmp_path, monkeypatch):
    missing = _by_name(doctor.run_checks(_Settings(tmp_path, runtime=("local", {"model": str(tmp_path / "m")})), None))
    assert missing["model"].status == "fail" and "never downloads" in missing["model"].fix
    assert "runtime local" not in missing  # a local runtime has no URL to reach
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    found = _by_name(doctor.run_checks(_Settings(tmp_path, runtime=("local", {"model": str(tmp_path / "m")})), None))
    assert found["model"].status == "ok"

    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: object())
    cache = tmp_path / "cache"
    embedded = _by_name(doctor.run_checks(_Settings(tmp_path, runtime=("local", {"cache_dir": str(cache)})), None))
    assert embedded["model"].status == "ok" and embedded["model cache"].status == "ok"
    cache.write_text("a file, not a directory")
    blocked = _by_name(doctor.run_checks(_Settings(tmp_path, runtime=("local", {"cache_dir": str(cache)})), None))
    assert blocked["model cache"].status == "fail" and "REEF_MODEL_CACHE" in blocked["model cache"].fix
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    absent = _by_name(doctor.run_checks(_Settings(tmp_path, runtime=("local", {})), None))
    assert absent["model"].status == "fail" and "reef-smollm2" in absent["model"].fix


@pytest.mark.parametrize(("free", "status"), [(50 * 1024**2, "fail"), (1024**3, "warn"), (100 * 1024**3, "ok")])
def test_free_disk(tmp_path, monkeypatch, free, status):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: usage(free * 2, free, free))
    check = doctor._disk(tmp_path / "state" / "deeper")
    assert check.status == status and str(tmp_path) in check.detail
    assert (check.fix != "") == (status != "ok")


def test_status_on_the_state_directory(tmp_path):
    (tmp_path / "state").mkdir()
    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    for scenario in ("support", "support", "triage"):
        rec = Record(id=new_id("rec"), scenario=scenario, request={"messages": []}, response={})
        store.add_record(rec)
        store.add_report(Report(id=new_id("rpt"), scenario=scenario, score=0.0, feedback="Be brief",
                                references=[rec.id], body_hash=new_id("h")))
    store.set_scenario_mode("triage", "paused", set_by="api", in_effect="auto")
    store.close()
    learning = {"recipe": {"name": "feedback_rules", "batch_size": 1, "max_score": 0.5, "proposer": None},
                "evaluator": {"name": "always"},
                "loop": {"enabled": False}}
    result = _cli(tmp_path, "status", "--json", config=learning)
    assert result.exit_code == 0, result.output
    rows = {r["scenario"]: r for r in _json(result.output)}
    assert set(rows) == {"default", "support", "triage"}
    assert rows["support"]["mode"] == "auto" and rows["support"]["eligible"] == 2
    assert rows["triage"]["mode"] == "paused" and rows["triage"]["eligible"] == 1
    assert rows["default"]["serving_release_id"] is None and rows["default"]["last_candidates"] == []
    table = _cli(tmp_path, "status", "-s", "triage", config=learning)
    assert table.exit_code == 0 and "triage" in table.output and "paused" in table.output
    assert "support" not in table.output and "no server running" in table.output


def test_doctor_changes_nothing(tmp_path):
    """The checks only read: doctor creates neither the state directory nor the database."""
    _cli(tmp_path, "doctor")
    assert not (tmp_path / "state").exists()


def test_database_without_its_driver_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as without reef-core[postgres]
    check = doctor._database("postgresql://reef:secret@127.0.0.1:9/reef")
    assert check.status == "fail" and "'psycopg' is not installed" in check.detail and "secret" not in check.detail
    assert check.fix == "pip install 'reef-core[postgres]'"
