"""Fixtures for the SAO recipe's tests: a runtime offering ``reef_core.TrainableBase`` on the
tiny random Llama of reef-train's fixtures (``tiny_model_dir``, ``tokenizer``: its pytest plugin).
Nothing is downloaded."""

from __future__ import annotations

import pytest

from reef_recipe_sao.testing import TinyTrainable


@pytest.fixture()
def runtime(tiny_model_dir):
    return TinyTrainable(tiny_model_dir)
