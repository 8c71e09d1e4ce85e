"""The skillclaw recipe: its contract, a composite candidate from a release's pool, retries and
degrading to skip on a failing evolver, the endpoint evolver, options."""

from __future__ import annotations

import json

import httpx
import pytest
from skillclaw_doubles import ScriptedEvolver, decision, experience, release_with_skills

from reef_core import Batch
from reef_core.testing import FakeUpstream, check_recipe, recipe_context
from reef_recipe_skillclaw import EndpointEvolver, EvolverError, RetryingEvolver, SkillClawRecipe, SkillPool
from reef_recipe_skillclaw.evolver import parse_json

SUMS = decision("create_skill", "sums", "Use for 'What is a + b?': answer with the number only",
                "Add the numbers and reply with the sum alone.\nExample: What is 3 + 4? -> 7")


def test_keeps_the_recipe_contract(tmp_path):
    evolver = ScriptedEvolver(create=SUMS)
    first, second = check_recipe(SkillClawRecipe(evolver=evolver), tmp_path)
    assert first is not None and (first.artifact_dir / "harness" / "skills" / "sums" / "SKILL.md").is_file()
    assert first.metadata["skillclaw"]["changes"] == [{"op": "create", "name": "sums", "fields": ["description", "body"]}]
    # the second night starts from the first candidate's pool: the same create collides and is merged
    assert second is not None and second.metadata["skillclaw"]["rationale"]["sums"]["action"] == "merge"


def test_a_night_from_a_release_writes_one_composite_candidate(tmp_path):
    current = release_with_skills(tmp_path / "rel", {"sums": ("add numbers", "Add."), "csv": ("csv", "Use csv.")})
    evolver = ScriptedEvolver(
        decide=decision("improve_skill", "sums", "add numbers", "Add, then reply with the number only.",
                        rationale="three sessions answered with prose"),
        create=SUMS.replace('"sums"', '"units"'))
    batch = Batch("default", [experience(0, 0.0, skills=["sums"], feedback="just the number please"),
                              experience(1, -1.0, skills=["sums"]), experience(2, 1.0)])
    cand = SkillClawRecipe(evolver=evolver).propose(batch, current, recipe_context(tmp_path / "scratch", current))
    harness = cand.artifact_dir / "harness"
    pool = SkillPool.load(harness)
    assert pool.names == ["csv", "sums", "units"]  # one snapshot: the old pool plus the night's changes
    assert pool.get("sums").body == "Add, then reply with the number only."
    assert (harness / "system.md").read_text() == "You are an agent.\n"
    meta = cand.metadata["skillclaw"]
    assert [(c["op"], c["name"]) for c in meta["changes"]] == [("update", "sums"), ("create", "units")]
    assert meta["rationale"]["sums"]["steps"][0]["rationale"] == "three sessions answered with prose"
    assert meta["rationale"]["sums"]["steps"][0]["sessions"] == ["rpt0", "rpt1"]
    assert meta["day"] == {"tasks": 3, "reported": 2, "judged": 1, "mean_score": 0.6167}  # (0 + 0.85 judged + 1) / 3
    assert "just the number please" in next(p for s, p, _ in evolver.calls if s == "decide")
    assert cand.base_release_id == "rel1" and "update sums" in cand.summary


def test_all_skips_propose_nothing(tmp_path):
    recipe = SkillClawRecipe(evolver=ScriptedEvolver())
    assert recipe.propose(Batch("default", [experience(0, 1.0)]), None, recipe_context(tmp_path, None)) is None


def test_retries_back_off_capped_then_degrade_to_skip(tmp_path):
    waits: list[float] = []
    failing = ScriptedEvolver(summarize=RuntimeError("503"), judge=RuntimeError("503"), create=RuntimeError("503"))
    recipe = SkillClawRecipe(evolver=failing, retries=6, backoff_s=1.0, backoff_cap_s=4.0)
    night, evolver = recipe.night(recipe_context(tmp_path, None), sleep=waits.append)
    from reef_recipe_skillclaw import build_digest

    result = night.run([build_digest(experience(0, -1.0), [])], SkillPool())
    assert waits[:5] == [1.0, 2.0, 4.0, 4.0, 4.0]  # doubling, capped; 5 waits between 6 tries
    assert len(failing.calls) == 18 and evolver.failures == 3  # summarize, judge, create: 6 tries each
    assert result.decisions[0].action == "skip" and result.decisions[0].reason == "the evolver failed"
    assert result.judged == {} and result.pool.names == []


def test_a_flaky_evolver_succeeds_after_retrying():
    flaky = ScriptedEvolver(summarize=[RuntimeError("reset"), RuntimeError("reset"), "fine"])
    retrying = RetryingEvolver(flaky, attempts=6, base_s=0.5, cap_s=30, sleep=lambda s: None)
    assert retrying.chat([{"role": "user", "content": "You review x"}], temperature=0.2, max_tokens=10) == "fine"
    assert len(flaky.calls) == 3 and retrying.failures == 0
    with pytest.raises(EvolverError):
        RetryingEvolver(ScriptedEvolver(summarize=RuntimeError("down")), attempts=2, sleep=lambda s: None).chat(
            [{"role": "user", "content": "You review x"}], temperature=0.2, max_tokens=10)


def test_an_openai_compatible_endpoint_is_an_evolver():
    with FakeUpstream("openai", lambda body: "```json\n" + SUMS + "\n```") as up:
        evolver = EndpointEvolver(up.url, "evolver-model", "secret")
        text = evolver.chat([{"role": "user", "content": "hi"}], temperature=0.4, max_tokens=64)
        evolver.close()
    assert parse_json(text)["name"] == "sums"
    assert up.requests[-1]["model"] == "evolver-model" and up.requests[-1]["temperature"] == 0.4


def test_a_failing_endpoint_raises_for_the_retries():
    evolver = EndpointEvolver("http://127.0.0.1:9/v1", "m", timeout_s=2)
    with pytest.raises(httpx.HTTPError):
        evolver.chat([{"role": "user", "content": "hi"}], temperature=0.1, max_tokens=4)
    evolver.close()


def test_the_runtime_is_the_default_evolver(tmp_path):
    ctx = recipe_context(tmp_path, None, answer=SUMS)
    cand = SkillClawRecipe().propose(Batch("default", [experience(0, 0.0)]), None, ctx)
    assert SkillPool.load(cand.artifact_dir / "harness").names == ["sums"]


def test_prompts_can_be_overridden_by_file(tmp_path):
    (tmp_path / "summarize.md").write_text("You review briefly: $digest")
    evolver = ScriptedEvolver()
    recipe = SkillClawRecipe(evolver=evolver, prompts_dir=str(tmp_path))
    recipe.propose(Batch("default", [experience(0, 1.0)]), None, recipe_context(tmp_path / "s", None))
    assert evolver.calls[0][1].startswith("You review briefly: Task rpt0")


@pytest.mark.parametrize("options, message", [
    ({"evolver": {"url": "http://x"}}, "evolver needs 'url'"),
    ({"evolver": {"url": "http://x", "model": "m", "temperature": 1}}, "not temperature"),
    ({"evolver": 3}, "evolver must be"),
    ({"judge_weights": {"speed": 1.0}}, "judge_weights"),
    ({"retries": 0}, "retries must be"),
    ({"prompts_dir": "/no/such/dir"}, "not a directory"),
])
def test_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        SkillClawRecipe(**options)


def test_the_config_group_is_the_constructor(tmp_path):
    import inspect

    import yaml

    from reef_recipe_skillclaw import reef_config_dir

    conf = yaml.safe_load((__import__("pathlib").Path(reef_config_dir()) / "recipe" / "skillclaw.yaml").read_text())
    params = inspect.signature(SkillClawRecipe).parameters
    assert conf.pop("name") == "skillclaw"
    assert set(conf) == set(params)
    assert all(conf[k] == params[k].default for k in conf if k != "judge_weights")
    assert json.dumps(conf["judge_weights"]) == json.dumps(SkillClawRecipe().weights)
