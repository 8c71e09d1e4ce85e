"""Fixtures for reef-torch tests: a tiny random Llama with an offline character tokenizer
(``reef_train.testing.build_tiny_model``).

Nothing is downloaded: the tokenizer is built with ``tokenizers`` in memory and the model
from a ``LlamaConfig`` with a fixed seed.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from reef_train.testing import build_tiny_model


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: loads the real SmolLM2 and trains it (minutes on CPU)")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
