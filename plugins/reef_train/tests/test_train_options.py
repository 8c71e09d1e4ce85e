"""``LoraOptions``: every weight recipe's LoRA and optimizer options, checked in one place with
every problem named as the recipe's option is named."""

from __future__ import annotations

import pytest

from reef_train import LoraOptions, learner_option_problems


def test_defaults_and_the_load_trainable_arguments():
    opts = LoraOptions()
    assert (opts.lr, opts.lora_rank, opts.lora_alpha, opts.max_grad_norm, opts.optimizer) == (1e-4, 16, 32, 1.0, "adamw")
    assert opts.lora() == {"r": 16, "alpha": 32, "seed": 0, "include_lm_head": False}  # auto: the base's device
    assert LoraOptions(device="cpu", lora_lm_head=True).lora()["device"] == "cpu"
    coerced = LoraOptions(lr=1, max_grad_norm=None, weight_decay=0)
    assert isinstance(coerced.lr, float) and coerced.max_grad_norm is None and isinstance(coerced.weight_decay, float)


@pytest.mark.parametrize(("options", "problem"), [
    ({"lr": 0}, "lr must be a number above 0, not 0"),
    ({"lr": float("nan")}, "lr must be a number above 0"),
    ({"lr": "fast"}, "lr must be a number above 0, not 'fast'"),
    ({"lora_rank": 0}, "lora_rank must be an integer of 1 or more, not 0"),
    ({"lora_alpha": 2.5}, "lora_alpha must be an integer of 1 or more, not 2.5"),
    ({"lora_lm_head": "false"}, "lora_lm_head must be true or false, not 'false'"),
    ({"max_grad_norm": -1}, "max_grad_norm must be a number above 0, or null (no clipping), not -1"),
    ({"optimizer": "sgd"}, "optimizer must be one of adamw, adam, not 'sgd'"),
    ({"beta2": 1.0}, "beta2 must be a number in [0, 1), not 1.0"),
    ({"eps": 0}, "eps must be a number above 0"),
    ({"weight_decay": -0.1}, "weight_decay must be a number of 0 or more"),
    ({"device": "gpu"}, "device must be auto or a torch device (cpu, cuda, cuda:1, mps), not 'gpu'"),
    ({"seed": True}, "seed must be an integer, not True"),
])
def test_each_bad_option_is_named(options, problem):
    with pytest.raises(ValueError) as err:
        LoraOptions(**options)
    assert problem in str(err.value)


def test_every_problem_is_named_at_once():
    with pytest.raises(ValueError) as err:
        LoraOptions(lr=-1, lora_rank=0, device="tpu0")
    assert str(err.value).count(" must be ") == 3


def test_a_recipes_options_pick_the_lora_fields_and_the_fixed_values_win():
    recipe_options = {"lr": 3e-4, "lora_rank": 8, "weight_decay": 0.1, "beta2": 0.5, "batch_size": 16,
                      "eps_clip_low": 0.2, "trainer": None, "seed": 7}
    opts = LoraOptions.from_options(recipe_options, beta2=0.98, optimizer="adam")
    assert (opts.lr, opts.lora_rank, opts.weight_decay, opts.seed) == (3e-4, 8, 0.1, 7)
    assert (opts.beta2, opts.optimizer) == (0.98, "adam")  # what the recipe fixes, over what it was given
    assert learner_option_problems(recipe_options) == []


def test_learner_option_problems_names_the_lora_and_the_trainer_problems_together():
    problems = learner_option_problems({"lr": -1, "lora_rank": 0, "trainer": {"backend": "nope"}})
    assert len(problems) == 2
    assert "lr must be a number above 0" in problems[0] and "lora_rank must be an integer of 1 or more" in problems[0]
    assert "trainer.backend must be one of" in problems[1]
