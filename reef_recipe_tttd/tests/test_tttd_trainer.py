"""The ``trainer`` option: a bad one is a configuration error, and a grid's training step runs
as a Ray task (``trainer.backend: ray``) with the same adapter, learner state and metrics as in
process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reef_core import ActiveRelease, ConfigError
from reef_core.testing import build_configured, recipe_context
from reef_recipe_tttd import TTTDRecipe
from reef_recipe_tttd.testing import SCENARIO, sampled_grid
from reef_train import LocalTrainer, read_learner_state
from reef_train.testing import prompt_ids


@pytest.mark.parametrize(("overrides", "problem"), [
    (["recipe.trainer.backend=slurm"], "trainer.backend must be one of local, ray"),
    (["+recipe.trainer.gpus=1"], "trainer.gpus is not an option"),
    (["recipe.lora_rank=0"], "lora_rank must be an integer of 1 or more, not 0"),
])
def test_a_bad_trainer_or_lora_option_is_a_config_error(overrides, problem):
    with pytest.raises(ConfigError, match="invalid options in recipe for recipe 'tttd'") as err:
        build_configured("recipe", ["recipe=tttd", *overrides])
    assert problem in str(err.value)
    assert isinstance(TTTDRecipe().trainer, LocalTrainer)       # the default: in process


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reef-recipe-tttd[ray]')")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def _files(artifact: Path) -> list[str]:
    return sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*") if p.is_file())


@pytest.mark.slow
def test_the_step_runs_on_ray_with_the_same_results_as_in_process(ray_instance, tmp_path, tiny_model_dir, tokenizer,
                                                                 trainable_runtime):
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    grid = sampled_grid(tiny_model_dir, prompt_ids(tokenizer, "pack"),
                        lambda r: float(sum(t in digits for t in r)) + 0.01 * len(r), groups=2, rollouts=4, seed=1)
    results = {}
    for name, trainer in (("local", None), ("ray", {"backend": "ray", "num_cpus": 1, "timeout_s": 600})):
        recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=4, max_staleness=1, lora_rank=4, lora_alpha=8,
                            lora_lm_head=True, lr=1e-2, trainer=trainer)
        first = recipe.propose(grid, None, recipe_context(tmp_path / name / "s1", None, recipe="tttd",
                                                          runtime=trainable_runtime))
        shutil.copytree(first.artifact_dir, tmp_path / name / "rel1")
        # the next step continues the served adapter and Adam's moments (shipped to the worker)
        current = ActiveRelease(scenario=SCENARIO, release_id="rel1", content_hash="", path=tmp_path / name / "rel1")
        second = recipe.propose(grid, current, recipe_context(tmp_path / name / "s2", current, recipe="tttd",
                                                              runtime=trainable_runtime))
        results[name] = (first, second)

    for local, remote in zip(results["local"], results["ray"]):
        assert _files(local.artifact_dir) == _files(remote.artifact_dir)
        a = load_file(str(local.artifact_dir / "adapter" / "adapter_model.safetensors"))
        b = load_file(str(remote.artifact_dir / "adapter" / "adapter_model.safetensors"))
        assert a.keys() == b.keys()
        for key in a:  # the same seed and grid: the same weights, up to the worker's thread count
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)
        lm, rm = local.metadata["tttd"], remote.metadata["tttd"]
        assert {k: v for k, v in lm.items() if k != "metrics"} == {k: v for k, v in rm.items() if k != "metrics"}
        assert lm["metrics"].keys() == rm["metrics"].keys()
        for key, value in lm["metrics"].items():
            if isinstance(value, float):
                assert rm["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
            else:
                assert rm["metrics"][key] == value, key
    second = results["ray"][1]
    assert second.metadata["tttd"]["learner_from"] == "the serving release"
    assert read_learner_state(second.artifact_dir / "learner", "tttd").counters == {"steps": 2, "rollouts_used": 16}
    # the adapter was trained in a Ray worker: it names the base as the worker unpacked it
    assert "reef-train-step-" in (second.artifact_dir / "adapter" / "adapter_config.json").read_text()
