"""A weight recipe whose training step runs on Ray (``reef_train.make_trainer``) inside a
whole kernel: the adapter trained in a Ray worker is evaluated, published and served; a
worker killed mid-step fails that candidate with a clear reason and the server goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from reef_core import Candidate, Recipe, require_trainable
from reef_core.compose import build_reef
from reef_core.plugins import get_plugins
from reef_core.testing import TrainableEchoRuntime

from .conftest import add_plugin, feedback_rules_config, settings_for
from .test_chain import _seed

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reef-train[ray]')")
reef_train = pytest.importorskip("reef_train")
from reef_train.testing import build_tiny_model, word_adapter_step  # noqa: E402


def killed_step(payload, inputs, output):
    """A step whose worker dies (a node lost, an OOM kill)."""
    os.kill(os.getpid(), signal.SIGKILL)


class WordRecipe(Recipe):
    """A minimal weight recipe: each batch trains the word adapter one more step, through the
    trainer backend its ``trainer`` option names."""

    update_target = "adapter"
    filters = ("scored",)
    batch_size = 1
    default_evaluator = "always"

    def __init__(self, trainer: dict | None = None, die: bool = False):
        self.trainer = reef_train.make_trainer(trainer)
        self.step = killed_step if die else word_adapter_step

    def propose(self, batch, current, ctx):
        runtime = require_trainable(ctx.runtime, ctx.recipe)
        art = ctx.new_artifact()
        metrics = self.trainer.run(self.step, {"word": "mango", "prompts": ["fruit?"], "steps": 2},
                                   inputs={"base": runtime.base_model().path, "adapter": runtime.adapter_of(current)},
                                   output=art)
        return Candidate(scenario=batch.scenario, recipe=ctx.recipe, artifact_dir=art, metadata=metrics)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # killed_step lives here
    yield
    ray.shutdown()


@pytest.mark.slow
def test_a_weight_recipe_trains_on_ray_and_a_killed_worker_fails_only_its_candidate(ray_cluster, tmp_path):
    add_plugin("recipe", "ray_word", WordRecipe)
    model_dir = build_tiny_model(tmp_path / "tiny")

    class Down:
        url, dialect = "http://127.0.0.1:9", "openai"

    trainer = {"backend": "ray", "num_cpus": 1, "timeout_s": 300}
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "ray_word", "trainer": trainer}
    config["scenarios"] = {"killed": {"recipe_options": {"die": True}}}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), runtime=TrainableEchoRuntime(model_dir))
    _seed(reef.store, "default", 2)
    _seed(reef.store, "killed", 1)

    async def grow():
        await reef.start()
        try:
            published = await reef.learning.grow("default")
            serving = reef.releases.serving("default")
            killed = await reef.learning.grow("killed")
            after = await reef.learning.grow("default")  # the server and Ray are still fine
            return published, serving, killed, after, reef.releases.serving("killed")
        finally:
            await reef.stop()

    published, serving, killed, after, killed_serving = asyncio.run(grow())
    assert published.outcome == "published", published.reason
    candidate = reef.store.get_candidate(published.candidate_id)
    assert candidate.artifact["metadata"]["pid"] != os.getpid(), "the step must have run in a Ray worker"
    assert serving.release_id == published.release_id
    assert (Path(serving.path) / "adapter" / "adapter_model.safetensors").is_file()

    assert killed.outcome == "error" and killed_serving is None
    reason = reef.store.get_candidate(killed.candidate_id).reason
    assert "lost on Ray" in reason and "WorkerCrashedError" in reason, reason
    assert reef.store.get_candidate(killed.candidate_id).status == "error"

    assert after.outcome == "published", after.reason  # continued from the served adapter
    assert reef.store.head_release("default").release_id == after.release_id
