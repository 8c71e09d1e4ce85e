"""An artifact store with exactly the contract's required members serves a whole Reef:
publish through a growth step, rollback, and a restart on the same state."""

from __future__ import annotations

import pytest

from reef_core.contracts import ArtifactStore
from reef_core.plugins import get_plugins
from reef_core.testing import FakeUpstream, ReefServer, check_artifact_store

from .conftest import GOOD_FEEDBACK, add_plugin, ask, capital_model, feedback_rules_config, report, settings_for
from .minimal_store import DirectoryStore


class DuckDirectoryStore:
    """The same store without subclassing the contract (duck typing)."""

    def __init__(self, state_dir):
        self._impl = DirectoryStore(state_dir)

    def scenarios(self):
        return self._impl.scenarios()

    def head(self, scenario):
        return self._impl.head(scenario)

    def history(self, scenario):
        return self._impl.history(scenario)

    def publish(self, scenario, artifact_dir, manifest, *, expected_head):
        return self._impl.publish(scenario, artifact_dir, manifest, expected_head=expected_head)

    def materialize(self, scenario, commit, dest):
        return self._impl.materialize(scenario, commit, dest)


def test_the_store_defines_only_the_required_members():
    own = {name for name in vars(DirectoryStore) if not name.startswith("_")}
    assert own == set(ArtifactStore.__abstractmethods__)


@pytest.mark.parametrize("store_cls", [DirectoryStore, DuckDirectoryStore], ids=["subclass", "duck"])
def test_minimal_store_passes_the_kit(store_cls, tmp_path):
    history = check_artifact_store(lambda: store_cls(state_dir=tmp_path / "state"), tmp_path)
    assert [s.release_id for s in history] == ["rel_kit_2", "rel_kit_1"]


def test_kit_catches_a_store_without_compare_and_swap(tmp_path):
    class NoCas(DirectoryStore):
        def publish(self, scenario, artifact_dir, manifest, *, expected_head):
            return super().publish(scenario, artifact_dir, manifest, expected_head=self._head_commit(scenario))

    with pytest.raises(AssertionError, match="PublishConflict"):
        check_artifact_store(lambda: NoCas(state_dir=tmp_path / "s"), tmp_path)


@pytest.mark.parametrize("store_cls", [DirectoryStore, DuckDirectoryStore], ids=["subclass", "duck"])
def test_minimal_store_publishes_rolls_back_and_restarts(store_cls, tmp_path):
    add_plugin("artifact_store", "minimal", store_cls)
    conf = tmp_path / "conf"  # the config group file a plugin ships (reef_config_dir)
    (conf / "artifact_store").mkdir(parents=True)
    (conf / "artifact_store" / "minimal.yaml").write_text("name: minimal\n")
    get_plugins().config_dirs.append(("tests.loop", conf))
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"}, batch_size=1)
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, config, overrides=["artifact_store=minimal"])
        with ReefServer(tmp_path, settings=settings) as server, server.client() as client:
            r = ask(client, "What is the capital of France?")
            assert r.json()["choices"][0]["message"]["content"] == "I am not sure."
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            step = client.post("/reef/scenarios/default/grow").json()
            assert step["outcome"] == "published", step
            first = step["release_id"]
            assert "Paris" in ask(client, "What is the capital of France?").json()["choices"][0]["message"]["content"]
            r = ask(client, "What is the capital of Japan?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback="Answer in one word")
            assert client.post("/reef/scenarios/default/grow").json()["outcome"] == "published"
            back = client.post("/reef/scenarios/default/rollback", json={"release_id": first})
            assert back.status_code == 200, back.text
            detail = client.get(f"/reef/scenarios/default/releases/{first}")
            assert detail.status_code == 200 and detail.json()["manifest"]["release_id"] == first
            head = client.get("/reef/scenarios/default/releases").json()["releases"][0]["release_id"]
        assert head != first
        with ReefServer(tmp_path, settings=settings) as again, again.client() as client:
            r = ask(client, "What is the capital of Japan?")
            assert r.headers["x-reef-release-id"] == head and "Tokyo" in r.text
            assert len(client.get("/reef/scenarios/default/releases").json()["releases"]) == 3
