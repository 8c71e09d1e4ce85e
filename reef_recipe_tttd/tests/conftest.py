"""Fixtures for the TTTD recipe's tests: a tiny random Llama (``reef_train.testing``) and a
runtime offering ``reef_core.TrainableBase`` on it. Nothing is downloaded."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from reef_recipe_tttd.testing import TinyTrainable
from reef_train.testing import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture()
def runtime(tiny_model_dir):
    return TinyTrainable(tiny_model_dir)
