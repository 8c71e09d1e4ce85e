"""Fixtures for reef-train tests: a tiny random Llama with an offline character tokenizer
(``reef_train.testing.build_tiny_model``); nothing is downloaded."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from reef_train.testing import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
