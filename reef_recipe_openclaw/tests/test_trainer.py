"""The ``trainer`` option: a bad one is a configuration error, and the training step runs as a
Ray task (``trainer.backend: ray``) with the same adapter and metrics as in process."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reef_core import ActiveRelease, Batch, ConfigError, Experience
from reef_core.testing import build_configured, recipe_context
from reef_recipe_openclaw import OpenClawRecipe
from reef_recipe_openclaw.processor import METADATA_KEY
from reef_recipe_openclaw.testing import SCENARIO, chat_record, token_capture
from reef_train import LocalTrainer


def _trainer_overrides(recipe: str, trainer: dict) -> list[str]:
    """Command-line overrides setting ``recipe.trainer`` (``backend`` is in the recipe's yaml;
    other keys are added with ``+``), as a user would type them."""
    return [f"recipe={recipe}", *(f"{'' if key == 'backend' else '+'}recipe.trainer.{key}={value}"
                                  for key, value in trainer.items())]


@pytest.mark.parametrize(("trainer", "problem"), [
    ({"backend": "kubernetes"}, "trainer.backend must be one of local, ray"),
    ({"gpus": 1}, "trainer.gpus is not an option"),
    ({"backend": "ray", "timeout_s": 0}, "trainer.timeout_s must be above 0"),
    ({"num_cpus": "many"}, "trainer options:"),
])
def test_a_bad_trainer_option_is_a_config_error(trainer, problem):
    with pytest.raises(ConfigError, match="invalid options in recipe for recipe 'openclaw'") as err:
        build_configured("recipe", _trainer_overrides("openclaw", trainer))
    assert problem in str(err.value)
    assert isinstance(OpenClawRecipe().trainer, LocalTrainer)       # the default: in process


# ---------------------------------------------------------------------- on Ray


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reef-recipe-openclaw[ray]')")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def _turn(tokenizer, i, question, reply, *, score, eval_score, hints):
    messages = [{"role": "user", "content": question}]
    rec = chat_record(f"rec{i}", messages, reply, at=i, tokens=token_capture(tokenizer, messages, reply))
    meta = {"record_id": f"rec{i}", "eval_votes": [eval_score] * 3, "eval_score": eval_score, "hint_votes": [1, 1, 1],
            "hints": hints, "dispatch": "?", "reward": score, "next_state": {"role": "user", "text": "hm"}}
    return Experience(report_id=f"rep{i}", scenario=SCENARIO, score=score, feedback=None,
                      metadata={METADATA_KEY: meta}, created_at=datetime.now(timezone.utc), records=(rec,))


def _files(artifact: Path) -> list[str]:
    return sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*") if p.is_file())


@pytest.mark.slow
def test_the_step_runs_on_ray_with_the_same_results_as_in_process(ray_instance, tmp_path, trainable_runtime, tokenizer):
    batch = Batch(SCENARIO, [
        _turn(tokenizer, 0, "what is two plus two?", "- It is 4.", score=-1.0, eval_score=-1,
              hints=["Answer in one short sentence."]),
        _turn(tokenizer, 1, "name a fruit", "mango", score=1.0, eval_score=1, hints=[]),
    ])
    runtime = trainable_runtime
    ray_trainer = {"backend": "ray", "num_cpus": 1, "timeout_s": 600}
    results = {}
    for name, trainer in (("local", None), ("ray", ray_trainer)):
        recipe = OpenClawRecipe(lr=1e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, trainer=trainer,
                                state_dir=tmp_path / name / "state")
        first = recipe.propose(batch, None, recipe_context(tmp_path / name / "s1", None, recipe="openclaw",
                                                           runtime=runtime))
        shutil.copytree(first.artifact_dir, tmp_path / name / "rel1")
        # the next step continues the served adapter (shipped to the worker)
        current = ActiveRelease(scenario=SCENARIO, release_id="rel1", content_hash="", path=tmp_path / name / "rel1")
        second = recipe.propose(batch, current, recipe_context(tmp_path / name / "s2", current, recipe="openclaw",
                                                               runtime=runtime))
        results[name] = (first, second)

    for local, remote in zip(results["local"], results["ray"]):
        assert _files(local.artifact_dir) == _files(remote.artifact_dir)
        a = load_file(str(local.artifact_dir / "adapter" / "adapter_model.safetensors"))
        b = load_file(str(remote.artifact_dir / "adapter" / "adapter_model.safetensors"))
        assert a.keys() == b.keys()
        for key in a:  # the same seed and turns: the same weights, up to the worker's thread count
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)
        lm, rm = local.metadata["openclaw"], remote.metadata["openclaw"]
        assert {k: v for k, v in lm.items() if k != "metrics"} == {k: v for k, v in rm.items() if k != "metrics"}
        assert lm["metrics"].keys() == rm["metrics"].keys()
        for key, value in lm["metrics"].items():
            assert rm["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert results["ray"][1].metadata["openclaw"]["metrics"]["opd_turns"] == 2  # both captured top-K: hinted and anchor teachers
    # the adapter was trained in a Ray worker: it names the base as the worker unpacked it
    assert "reef-train-step-" in (results["ray"][1].artifact_dir / "adapter" / "adapter_config.json").read_text()
    assert "reef-train-step-" not in (results["local"][1].artifact_dir / "adapter" / "adapter_config.json").read_text()
