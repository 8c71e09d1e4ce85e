"""Crash recovery and consumption: a SIGKILL between the git publish and the database write,
records never consumed twice (also across restarts), interrupted candidates settled."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

from reef_core.commit.faults import FAULT_ENV
from reef_core.compose import build_reef
from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, Record, RecordStore, Report, new_id

from .conftest import (
    add_plugin,
    ask,
    feedback_rules_config,
    grow_steps,
    report,
    settings_for,
    wait_for,
    wait_published,
    write_config,
)


class Down:
    """An upstream nobody listens on: these tests never call the model."""

    url, dialect = "http://127.0.0.1:9", "openai"


def _seed(store: RecordStore, feedback: str, *, scenario: str = "default", score: float = 0.0) -> tuple[str, str]:
    rec = Record(id=new_id("rec"), scenario=scenario, request={"messages": [{"role": "user", "content": feedback}]},
                 response={"choices": [{"message": {"content": "?"}}]})
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario=scenario, score=score, feedback=feedback, references=[rec.id],
                 body_hash=new_id("h"))
    store.add_report(rpt)
    return rec.id, rpt.id


def _reef_cli(tmp_path, *args: str, fault: bool = False) -> subprocess.CompletedProcess:
    cfg = write_config(tmp_path / "cli.yaml", feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                   evaluator={"name": "always"}))
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = "git_published"
    return subprocess.run([sys.executable, "-m", "reef_core", *args, "-c", str(cfg),
                           f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={Down.url}"],
                          capture_output=True, text=True, env=env, timeout=120)


def _git_releases(state) -> list[str]:
    out = subprocess.run(["git", f"--git-dir={state / 'artifacts.git'}", "rev-list", "refs/reef/scenarios/default"],
                         capture_output=True, text=True)
    return out.stdout.split()


def test_sigkill_between_git_publish_and_database_write(tmp_path):
    state = tmp_path / "state"
    store = RecordStore(f"sqlite:///{state / 'reef.db'}")
    _seed(store, "Always cite the source")

    killed = _reef_cli(tmp_path, "grow", "-s", "default", fault=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_git_releases(state)) == 1
    assert store.list_releases("default") == []
    [candidate] = store.list_candidates("default")
    assert candidate.status == "selected"

    listed = _reef_cli(tmp_path, "releases", "-s", "default", "--json")
    assert listed.returncode == 0, listed.stderr
    [release] = json.loads(listed.stdout)
    assert release["candidate_id"] == candidate.id and release["sequence"] == 1
    assert store.get_candidate(candidate.id).status == "published"

    _seed(store, "Never guess numbers")
    grown = _reef_cli(tmp_path, "grow", "-s", "default", "--json")
    assert grown.returncode == 0, grown.stderr
    result = json.loads(grown.stdout)
    assert result["outcome"] == "published"
    rows = store.list_releases("default", newest_first=False)
    assert [r.sequence for r in rows] == [1, 2] and rows[1].parent_id == rows[0].release_id
    assert [r.git_commit for r in reversed(rows)] == _git_releases(state)
    store.close()


def test_restart_serves_the_recovered_head(tmp_path):
    """After a crash the next start reconciles, then serves the head the database missed."""
    state = tmp_path / "state"
    store = RecordStore(f"sqlite:///{state / 'reef.db'}")
    _seed(store, "Always cite the source")
    assert _reef_cli(tmp_path, "grow", fault=True).returncode == -signal.SIGKILL
    settings = settings_for(tmp_path, Down, feedback_rules_config(batch_size=1, loop_enabled=False))
    reef = Reef(settings, get_plugins())

    async def boot():
        await reef.start()
        try:
            return reef.serving_release("default")
        finally:
            await reef.stop()

    serving = asyncio.run(boot())
    head = store.head_release("default")
    assert serving is not None and serving.release_id == head.release_id
    assert (serving.harness_dir / "rules.md").read_text() == "- Always cite the source.\n"
    store.close()


def _kernel(tmp_path, batch_size: int = 1, recipe: dict | None = None) -> Reef:
    config = feedback_rules_config(batch_size=batch_size, loop_enabled=False, evaluator={"name": "always"})
    if recipe:
        config["recipe"] = recipe
    return build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)


def test_a_record_is_never_consumed_twice_across_restarts(tmp_path):
    reef = _kernel(tmp_path)
    rec, first_report = _seed(reef.store, "Always cite the source")
    [step] = grow_steps(reef)
    assert step.outcome == "published"

    # another report quoting the consumed record is not eligible, before or after a restart
    quoting = Report(id=new_id("rpt"), scenario="default", score=0.0, feedback="Be brief", references=[rec],
                     body_hash="x")
    reef2 = _kernel(tmp_path)
    reef2.store.add_report(quoting)
    [again] = grow_steps(reef2)
    assert again.outcome == "nothing" and "no eligible experience" in again.reason
    assert reef2.store.consumed([rec, first_report, quoting.id]) == {rec, first_report}

    fresh_rec, fresh_report = _seed(reef2.store, "Be brief")
    reef3 = _kernel(tmp_path)
    [third] = grow_steps(reef3)
    assert third.outcome == "published"
    consumers = {c.candidate_id for c in _consumption(reef3.store)}
    assert len(consumers) == 2
    assert reef3.store.consumed([fresh_rec, fresh_report]) == {fresh_rec, fresh_report}


def _consumption(store: RecordStore):
    from sqlmodel import Session, select

    from reef_core.store import Consumption

    with Session(store._reader) as s:
        return list(s.exec(select(Consumption)).all())


class FailingRecipe:
    update_target = "harness"
    filters = ("scored",)
    batch_size = 1
    default_evaluator = "always"

    def propose(self, batch, current_artifact, ctx):
        raise ValueError("no idea what to learn")


def test_a_failed_proposal_releases_its_batch(tmp_path):
    add_plugin("recipe", "failing", FailingRecipe)
    reef = _kernel(tmp_path, recipe={"name": "failing"})
    rec, rpt = _seed(reef.store, "Be brief")
    [step] = grow_steps(reef)
    assert step.outcome == "error" and "ValueError: no idea what to learn" in step.reason
    assert reef.store.consumed([rec, rpt]) == set()
    [candidate] = reef.store.list_candidates("default")
    assert candidate.status == "error" and "no idea" in candidate.reason


def test_feedback_without_text_is_consumed_without_a_candidate(tmp_path):
    reef = _kernel(tmp_path)
    rec, rpt = _seed(reef.store, "")
    [step, after] = grow_steps(reef, times=2)
    assert step.outcome == "skipped"
    assert after.outcome == "nothing"
    assert reef.store.consumed([rec, rpt]) == {rec, rpt}
    assert reef.store.list_releases("default") == []


def test_interrupted_candidates_are_settled_on_start(tmp_path):
    reef = _kernel(tmp_path)
    rec, rpt = _seed(reef.store, "Be brief")
    cid = new_id("cand")
    reef.store.consume(cid, "default", record_ids=[rec], report_ids=[rpt])
    reef.store.add_candidate(CandidateRow(id=cid, scenario="default", recipe="feedback_rules", status="evaluating"))
    [step] = grow_steps(reef)
    assert step.outcome == "nothing"
    row = reef.store.get_candidate(cid)
    assert row.status == "error" and "interrupted" in row.reason
    # its experience returned to the pool, eligible again only under the return rule
    assert reef.store.consumption_states([rec, rpt]) == {rec: ("returned", 1), rpt: ("returned", 1)}
    assert reef.store.consumed([rec, rpt]) == set()


class BrokenHarnessRecipe(FailingRecipe):
    def propose(self, batch, current_artifact, ctx):
        from reef_core.types import Candidate

        art = ctx.new_artifact()
        (art / "harness").mkdir()
        (art / "harness" / "config.json").write_text("{not json")
        return Candidate(scenario=batch.scenario, recipe="broken", artifact_dir=art)


def test_an_unservable_artifact_is_the_recipes_failure(tmp_path):
    add_plugin("recipe", "broken", BrokenHarnessRecipe)
    reef = _kernel(tmp_path, recipe={"name": "broken"})
    rec, rpt = _seed(reef.store, "Be brief")
    [step] = grow_steps(reef)
    assert step.outcome == "error" and "config.json is not valid JSON" in step.reason
    assert "failed: ArtifactError" in step.reason
    assert reef.store.consumed([rec, rpt]) == set()
    assert reef.store.list_releases("default") == []


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, upstream_url: str, *, fault: bool) -> tuple[subprocess.Popen, str]:
    """``reef serve`` in a subprocess; returns (process, base URL) once it answers /healthz."""
    import httpx

    cfg = write_config(tmp_path / "serve.yaml", feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = "git_published"
    log_path = tmp_path / f"serve-{port}.log"
    log = log_path.open("w")  # a file, not a pipe: a chatty server must never block on a full pipe
    proc = subprocess.Popen([sys.executable, "-m", "reef_core", "serve", "-c", str(cfg), f"server.port={port}",
                             f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={upstream_url}",
                             "server.log_level=warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    log.close()  # the child keeps its own descriptor
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"reef serve exited with {proc.returncode}: {log_path.read_text()}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, "reef serve to start")
    return proc, url


def test_sigkill_of_the_server_between_git_publish_and_database_write(tmp_path):
    import httpx

    from reef_core.testing import FakeUpstream

    with FakeUpstream("openai", lambda body: "?") as up:
        proc, url = _serve(tmp_path, up.url, fault=True)
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                r = ask(client, "What is the capital of Italy?")
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback="Name the capital")
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        state = tmp_path / "state"
        assert len(_git_releases(state)) == 1
        store = RecordStore(f"sqlite:///{state / 'reef.db'}")
        assert store.list_releases("default") == []

        proc, url = _serve(tmp_path, up.url, fault=False)
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                chain = client.get("/reef/scenarios/default/releases").json()
                [first] = chain["releases"]
                assert chain["serving_release_id"] == first["release_id"]
                assert first["git_commit"] == _git_releases(state)[0]
                r = ask(client, "And of France?")
                assert r.headers["x-reef-release-id"] == first["release_id"]
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback="Be brief")
                wait_published(client, 2)
                second = client.get("/reef/scenarios/default/releases").json()["releases"][0]
                assert second["sequence"] == 2 and second["parent_id"] == first["release_id"]
                candidates = client.get("/reef/scenarios/default/candidates").json()["candidates"]
                assert [c["status"] for c in candidates] == ["published", "published"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        assert [r.git_commit for r in store.list_releases("default")] == _git_releases(state)
        store.close()


def test_a_recorded_release_marks_its_candidate_published_on_start(tmp_path):
    """A crash between the release row and the candidate update leaves a 'selected' candidate."""
    reef = _kernel(tmp_path)
    _seed(reef.store, "Be brief")
    [step] = grow_steps(reef)
    reef.store.update_candidate(step.candidate_id, status="selected", release_id=None)
    reef2 = _kernel(tmp_path)
    grow_steps(reef2)
    row = reef2.store.get_candidate(step.candidate_id)
    assert row.status == "published" and row.release_id == step.release_id
