"""The ``trainer`` option: a bad one is a configuration error, and the training step runs as a
Ray task (``trainer.backend: ray``) with the same artifact and metrics as in process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reef_core import ConfigError
from reef_core.testing import build_configured
from reef_recipe_sao import SAORecipe
from reef_recipe_sao.testing import SCENARIO, context, release_of, sampled_batch
from reef_train import LocalTrainer, read_learner_state
from reef_train.testing import prompt_ids


def _trainer_overrides(recipe: str, trainer: dict) -> list[str]:
    """Command-line overrides setting ``recipe.trainer`` (``backend`` is in the recipe's yaml;
    other keys are added with ``+``), as a user would type them."""
    return [f"recipe={recipe}", *(f"{'' if key == 'backend' else '+'}recipe.trainer.{key}={value}"
                                  for key, value in trainer.items())]


@pytest.mark.parametrize(("trainer", "problem"), [
    ({"backend": "slurm"}, "trainer.backend must be one of local, ray"),
    ({"num_gpu": 1}, "trainer.num_gpu is not an option"),
    ({"backend": "ray", "num_gpus": -1}, "trainer.num_cpus and trainer.num_gpus must be 0 or more"),
])
def test_a_bad_trainer_option_is_a_config_error(trainer, problem):
    with pytest.raises(ConfigError, match="invalid options in recipe for recipe 'sao'") as err:
        build_configured("recipe", _trainer_overrides("sao", trainer))
    assert problem in str(err.value)
    assert isinstance(SAORecipe().trainer, LocalTrainer)       # the default: in process
    assert isinstance(SAORecipe(trainer={}).trainer, LocalTrainer)


def test_a_bad_trainer_option_on_the_command_line_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REEF_PLUGINS", "REEF_UPSTREAM_URL")}
    result = subprocess.run([sys.executable, "-m", "reef_core", "serve", "recipe=sao", "recipe.trainer.backend=slurm",
                             "+evaluator.tasks=[{prompt: hi, expected: hi}]"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "trainer.backend must be one of local, ray" in lines[0], result.stderr


# ---------------------------------------------------------------------- on Ray


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reef-recipe-sao[ray]')")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def _files(artifact: Path) -> list[str]:
    return sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*") if p.is_file())


def _assert_same_artifact(local: Path, remote: Path) -> None:
    assert _files(local) == _files(remote)
    for name in ("adapter/adapter_model.safetensors", "learner/value_head.safetensors",
                 "learner/critic/adapter_model.safetensors"):
        a, b = load_file(str(local / name)), load_file(str(remote / name))
        assert a.keys() == b.keys()
        for key in a:  # the same seeds and data: the same weights, up to the worker's thread count
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)


def _assert_same_metrics(local: dict, remote: dict) -> None:
    assert local.keys() == remote.keys()
    for key, value in local.items():
        if isinstance(value, float):
            assert remote[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        elif not isinstance(value, (dict, list)):
            assert remote[key] == value, key


@pytest.mark.slow
def test_the_step_runs_on_ray_with_the_same_results_as_in_process(ray_instance, tmp_path, tiny_model_dir, tokenizer,
                                                                 trainable_runtime):
    prompts = [prompt_ids(tokenizer, w) for w in ["one", "two", "three", "four"]]
    batch = sampled_batch(tiny_model_dir, prompts, lambda r: float(r[0] % 2), seed=3)
    ray_trainer = {"backend": "ray", "num_cpus": 1, "timeout_s": 600}
    results = {}
    for name, trainer in (("local", None), ("ray", ray_trainer)):
        # the batch, sampled before the lineage's first step, is two steps old at the third: a
        # max_staleness of 1 would drop it there, and that step would propose nothing to compare
        recipe = SAORecipe(batch_size=4, num_critic_only_steps=1, max_staleness=2, trainer=trainer,
                           state_dir=tmp_path / name / "state")
        # a warm-up step (critic only) advances the lineage, then the policy moves
        assert recipe.propose(batch, None, context(tmp_path / name, None, trainable_runtime, "s1")) is None
        head = recipe.lineages.head(SCENARIO)
        assert read_learner_state(head.checkpoint / "learner", "sao").counters["steps"] == 1
        first = recipe.propose(batch, None, context(tmp_path / name, None, trainable_runtime, "s2"))
        shutil.copytree(first.artifact_dir, tmp_path / name / "rel1")
        # serving moved to a release this lineage does not know (no content hash): the next step
        # continues the served adapter and learner state (shipped to the worker)
        current = release_of(tmp_path / name / "rel1", "rel1")
        second = recipe.propose(batch, current, context(tmp_path / name, current, trainable_runtime, "s3"))
        results[name] = (first, second)

    for local, remote in zip(results["local"], results["ray"]):
        _assert_same_artifact(local.artifact_dir, remote.artifact_dir)
        lm, rm = local.metadata["sao"], remote.metadata["sao"]
        assert {k: v for k, v in lm.items() if k != "metrics"} == {k: v for k, v in rm.items() if k != "metrics"}
        _assert_same_metrics(lm["metrics"], rm["metrics"])
        assert local.summary.split(",")[0] == remote.summary.split(",")[0]
    assert results["ray"][1].metadata["sao"]["learner_from"] == "the serving release"
    assert (results["ray"][1].metadata["sao"]["steps"], results["ray"][1].metadata["sao"]["actor_steps"]) == (3, 2)
    # the adapter was trained in a Ray worker: it names the base as the worker unpacked it
    config = (results["ray"][1].artifact_dir / "adapter" / "adapter_config.json").read_text()
    assert "reef-train-step-" in config and "reef-train-step-" not in \
        (results["local"][1].artifact_dir / "adapter" / "adapter_config.json").read_text()
