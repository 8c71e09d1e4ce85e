"""Pytest fixtures for weight-recipe authors, loaded automatically where reef-train is installed
(the ``pytest11`` entry point), as reef-core's own fixtures are:

- ``tiny_model_dir``: a tiny random Llama with an offline character tokenizer
  (``reef_train.testing.build_tiny_model``), built once per test session;
- ``tokenizer``: its tokenizer;
- ``trainable_runtime``: a runtime offering ``reef_core.TrainableBase`` on it
  (``reef_core.testing.TrainableEchoRuntime``: training loads the files, calls are echoed),
  what a weight recipe's ``propose`` needs; skipped where reef-core is not installed.

Nothing is downloaded: Hugging Face's offline switches are set (unless the environment sets
them) before any test runs. A ``conftest.py`` fixture of the same name takes precedence.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from reef_train.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture()
def trainable_runtime(tiny_model_dir):
    testing = pytest.importorskip("reef_core.testing", reason="reef-core is not installed")
    return testing.TrainableEchoRuntime(tiny_model_dir)
