"""The harness surface: parsing, injection per dialect, the per-release cache, Anthropic clients."""

from __future__ import annotations

import json

from reef_core.commit.harness import HarnessCache, harness_bundle, inject, read_harness
from reef_core.testing import FakeUpstream, ReefServer, system_prompt
from reef_core.types import ActiveRelease

from .conftest import (
    GOOD_FEEDBACK,
    feedback_rules_config,
    report,
    settings_for,
    wait_for,
)


def _tree(root, *, system="You are Reef's test agent.", rules="- Be brief.\n"):
    h = root / "harness"
    (h / "skills" / "search").mkdir(parents=True)
    (h / "skills" / "plain").mkdir(parents=True)
    (h / "system.md").write_text(system)
    (h / "rules.md").write_text(rules)
    (h / "skills" / "search" / "SKILL.md").write_text(
        "---\nname: web-search\ndescription: Look things up on the web\n---\n# Search\nSteps...\n")
    (h / "skills" / "plain" / "SKILL.md").write_text("# Plain\n\nSummarise long documents.\n")
    (h / "config.json").write_text(json.dumps({"model": "x"}))
    return ActiveRelease(scenario="s", release_id="rel_1", content_hash="c", path=root)


def test_read_harness_parses_every_part(tmp_path):
    harness = read_harness(_tree(tmp_path).harness_dir)
    assert harness.system == "You are Reef's test agent." and harness.rules == "- Be brief."
    assert [(s.name, s.description) for s in harness.skills] == [
        ("plain", "Summarise long documents."), ("web-search", "Look things up on the web")]
    assert harness.config == {"model": "x"}
    prompt = harness.prompt()
    assert prompt.index("You are Reef's") < prompt.index("# Rules") < prompt.index("# Skills")
    assert "- web-search: Look things up on the web" in prompt
    assert read_harness(None).empty and read_harness(tmp_path / "missing").empty


def test_inject_openai_and_anthropic(tmp_path):
    harness = read_harness(_tree(tmp_path).harness_dir)
    block = harness.prompt()
    user = {"role": "user", "content": "hi"}

    body = {"model": "m", "messages": [user]}
    out = inject(body, "openai", harness)
    assert out["messages"] == [{"role": "system", "content": block}, user]
    assert body["messages"] == [user]  # the client's body is not modified

    out = inject({"messages": [{"role": "system", "content": "Client rules."}, user]}, "openai", harness)
    assert out["messages"][0] == {"role": "system", "content": block + "\n\nClient rules."}
    parts = [{"type": "text", "text": "x"}]
    out = inject({"messages": [{"role": "system", "content": parts}, user]}, "openai", harness)
    assert out["messages"][0] == {"role": "system", "content": block} and out["messages"][1]["content"] == parts

    assert inject({"messages": [user]}, "anthropic", harness)["system"] == block
    assert inject({"system": "Mine.", "messages": [user]}, "anthropic", harness)["system"] == block + "\n\nMine."
    blocks = inject({"system": [{"type": "text", "text": "Mine."}], "messages": [user]}, "anthropic", harness)
    assert blocks["system"] == [{"type": "text", "text": block}, {"type": "text", "text": "Mine."}]

    empty = read_harness(tmp_path / "none")
    assert inject(body, "openai", empty) is body


def test_cache_reads_each_release_once(tmp_path):
    release = _tree(tmp_path)
    cache = HarnessCache()
    first = cache.apply({"messages": [{"role": "user", "content": "q"}]}, "openai", release)
    (release.harness_dir / "rules.md").write_text("- Changed on disk.\n")
    second = cache.apply({"messages": [{"role": "user", "content": "q"}]}, "openai", release)
    assert first == second and "Be brief" in second["messages"][0]["content"]


def test_bundle_lists_files_with_checksums(tmp_path):
    release = _tree(tmp_path)
    (release.harness_dir / "blob.bin").write_bytes(b"\xff\x00")
    data = harness_bundle(release).to_json()
    files = {f["path"]: f for f in data["files"]}
    assert sorted(files) == ["blob.bin", "config.json", "rules.md", "skills/plain/SKILL.md",
                             "skills/search/SKILL.md", "system.md"]
    assert files["blob.bin"]["encoding"] == "base64" and files["rules.md"]["encoding"] == "utf-8"
    assert len(files["rules.md"]["sha256"]) == 64 and data["release_id"] == "rel_1"


def test_anthropic_clients_get_the_harness_in_system(tmp_path):
    def model(body):
        return "Rome." if GOOD_FEEDBACK.lower() in system_prompt(body).lower() else "Unsure."

    with FakeUpstream("anthropic", model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.anthropic()
            first = client.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=[{"role": "user", "content": "Capital of Italy?"}])
            assert first.parse().content[0].text == "Unsure."
            report(server.client(), [first.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            wait_for(lambda: server.reef.serving_release("default"), "the release to serve")
            second = client.messages.create(model="m", max_tokens=50, system="Be terse.",
                                            messages=[{"role": "user", "content": "Capital of Italy?"}])
            assert second.content[0].text == "Rome."
            sent = up.requests[-1]["system"]
            assert sent.endswith("\n\nBe terse.") and GOOD_FEEDBACK in sent
