"""Rollback as an operator uses it: to the release already serving (nothing published, and the
answer says so), back to the base model (a new release with no harness and no adapter), over
HTTP and from the command line, where it never loads the runtime's model."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from reef_core.builtins.git_store import GitArtifactStore
from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.cli import main
from reef_core.commit.chain import EMPTY_CONTENT, ReleaseChain
from reef_core.store import RecordStore, Release, to_json
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import GOOD_FEEDBACK, ask, capital_model, feedback_rules_config, settings_for, wait_for, write_config
from .test_recovery import Down

JAPAN = "What is the capital of Japan?"


def _publish_rule(state_dir, tmp_path) -> Release:
    """Publish a harness release with the rule that makes the capital model answer, as another
    process would (a running server follows it)."""
    artifact = tmp_path / "artifact"
    (artifact / "harness").mkdir(parents=True)
    (artifact / "harness" / "rules.md").write_text(f"- {GOOD_FEEDBACK}\n")
    store = RecordStore(f"sqlite:///{state_dir / 'reef.db'}")
    try:
        chain = ReleaseChain(GitArtifactStore(state_dir=state_dir), store, tmp_path / "materialized")
        return chain.record(chain.publish("default", artifact, expected_head=None))
    finally:
        store.close()


def _serving(server) -> str | None:
    release = server.reef.serving_release("default")
    return release.release_id if release is not None else None


def _chain(client) -> list[dict]:
    return client.get("/reef/scenarios/default/releases").json()["releases"]


def test_rollback_over_http_to_the_serving_release_and_to_base(tmp_path):
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"})
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, config)
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            first = to_json(_publish_rule(tmp_path / "state", tmp_path))
            wait_for(lambda: _serving(server) == first["release_id"], "the server to follow the release")
            assert ask(client, JAPAN).json()["choices"][0]["message"]["content"] == "The capital is Tokyo."

            same = client.post("/reef/scenarios/default/rollback", json={"release_id": first["release_id"]})
            assert same.status_code == 200, same.text
            assert same.json()["published"] is False and same.json()["release"]["release_id"] == first["release_id"]
            assert "already the head" in same.json()["message"] and "nothing was published" in same.json()["message"]
            assert len(_chain(client)) == 1

            base = client.post("/reef/scenarios/default/rollback", json={"to": "base"})
            assert base.status_code == 200, base.text
            row = base.json()["release"]
            assert base.json()["published"] is True and "rollback to base" in base.json()["message"]
            assert row["operation"] == "rollback" and row["sequence"] == 2 and row["content_hash"] == EMPTY_CONTENT
            assert row["parent_id"] == first["release_id"]
            detail = client.get(f"/reef/scenarios/default/releases/{row['release_id']}").json()
            assert detail["manifest"]["files"] == {} and detail["manifest"]["rollback_to"] == "base"
            assert client.get("/reef/scenarios/default/releases").json()["serving_release_id"] == row["release_id"]
            answer = ask(client, JAPAN)
            assert answer.headers["x-reef-release-id"] == row["release_id"]
            assert answer.json()["choices"][0]["message"]["content"] == "I am not sure."  # no harness any more

            again = client.post("/reef/scenarios/default/rollback", json={"to": "base"})
            assert again.json()["published"] is False and "already serves the base model" in again.json()["message"]
            assert len(_chain(client)) == 2

            back = client.post("/reef/scenarios/default/rollback", json={"release_id": first["release_id"]})
            assert back.json()["published"] is True and back.json()["release"]["content_hash"] == first["content_hash"]
            twice = client.post("/reef/scenarios/default/rollback", json={"release_id": first["release_id"]})
            assert twice.json()["published"] is False
            assert f"already serves the content of release {first['release_id']}" in twice.json()["message"]
            assert len(_chain(client)) == 3

            for bad in ({}, {"release_id": first["release_id"], "to": "base"}, {"to": "nothing"}):
                refused = client.post("/reef/scenarios/default/rollback", json=bad)
                assert refused.status_code == 422, (bad, refused.text)
            assert len(_chain(client)) == 3

            # the command line sends the same to the running server
            cfg = write_config(tmp_path / "cli.yaml", config)
            args = ["-c", str(cfg), f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={up.url}"]
            cli = CliRunner().invoke(main, ["rollback", "-s", "default", "--url", server.url, "base", *args])
            assert cli.exit_code == 0, cli.output
            assert "rollback to base" in cli.output and len(_chain(client)) == 4
            cli = CliRunner().invoke(main, ["rollback", "-s", "default", "--url", server.url, "base", *args])
            assert cli.exit_code == 0 and "nothing was published" in cli.output and len(_chain(client)) == 4


def test_rollback_of_a_scenario_without_releases_to_base_is_a_no_op(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up)) as server:
            client = server.client()
            r = client.post("/reef/scenarios/default/rollback", json={"to": "base"})
            assert r.status_code == 200 and r.json()["published"] is False and r.json()["release"] is None
            assert "has no release" in r.json()["message"] and _chain(client) == []
            missing = client.post("/reef/scenarios/default/rollback", json={"release_id": "rel_nope"})
            assert missing.status_code == 404


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """Every start of the runtime (what loads a local runtime's model) in this process."""
    started: list[str] = []

    async def start(self) -> None:
        started.append("start")

    monkeypatch.setattr(UpstreamRuntime, "start", start)
    return started


def _invoke(tmp_path, *args: str):
    cfg = write_config(tmp_path / "cli.yaml", feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                   evaluator={"name": "always"}))
    return CliRunner().invoke(main, [*args, "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                     f"runtime.upstream_url={Down.url}"])


def test_cli_rollback_works_on_the_chain_without_loading_the_model(tmp_path, loads):
    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    try:
        nothing = _invoke(tmp_path, "rollback", "-s", "default", "base")
        assert nothing.exit_code == 0 and "has no release" in nothing.output
        first = _publish_rule(tmp_path / "state", tmp_path)

        same = _invoke(tmp_path, "rollback", "-s", "default", first.release_id)
        assert same.exit_code == 0, same.output
        assert f"release {first.release_id} is already the head" in same.output
        assert len(store.list_releases("default")) == 1

        base = _invoke(tmp_path, "rollback", "-s", "default", "base")
        assert base.exit_code == 0 and "published release" in base.output and "rollback to base" in base.output
        head = store.head_release("default")
        assert head.sequence == 2 and head.operation == "rollback" and head.content_hash == EMPTY_CONTENT

        back = _invoke(tmp_path, "rollback", "-s", "default", first.release_id)
        assert back.exit_code == 0 and f"rollback to {first.release_id}" in back.output
        assert store.head_release("default").content_hash == first.content_hash

        bad = _invoke(tmp_path, "rollback", "-s", "default", "rel_nope")
        assert bad.exit_code == 1 and "has no release 'rel_nope'" in bad.output
        assert loads == []
    finally:
        store.close()
