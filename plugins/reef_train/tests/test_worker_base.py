"""``base_input`` / ``WorkerBase``: a training step's ``base`` input as the served base
``load_trainable`` takes, the same for every weight recipe."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from reef_train import WorkerBase, base_input, load_trainable, trainable_parameters


def test_the_base_input_is_a_worker_base_on_the_payloads_device(tmp_path):
    base = base_input({"base": str(tmp_path), "adapter": None}, "SAO", device="cpu")
    assert base == WorkerBase(path=tmp_path, device="cpu")
    assert isinstance(base.path, Path)
    assert base_input({"base": tmp_path}, "OpenClaw").device == "auto"
    assert pickle.loads(pickle.dumps(base)) == base  # it may travel to a Ray worker


@pytest.mark.parametrize("inputs", [{"base": None, "adapter": None}, {"adapter": None}])
def test_a_step_without_a_base_names_its_recipe(inputs):
    with pytest.raises(ValueError, match=r"the OpenClaw step needs the base model directory \(inputs\['base'\]\)"):
        base_input(inputs, "OpenClaw")


def test_load_trainable_takes_a_worker_base(tiny_model_dir):
    policy = load_trainable(base_input({"base": tiny_model_dir}, "test", device="cpu"), r=2)
    params = list(trainable_parameters(policy))
    assert params and all(p.device.type == "cpu" for p in params)


def test_the_trainable_runtime_fixture_serves_the_tiny_model_to_training(trainable_runtime, tiny_model_dir):
    base = trainable_runtime.base_model()
    assert (base.path, base.device) == (tiny_model_dir, "cpu") and trainable_runtime.adapter_of(None) is None
    assert trainable_runtime.trainable_problem() is None
    assert all(p.device.type == "cpu" for p in trainable_parameters(load_trainable(base, r=2)))
