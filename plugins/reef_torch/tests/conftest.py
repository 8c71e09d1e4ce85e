"""Fixtures for reef-torch tests: the tiny random Llama with an offline character tokenizer
comes from reef-train's pytest plugin (``tiny_model_dir``, ``tokenizer``; it sets Hugging
Face's offline switches). Nothing is downloaded."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: loads the real SmolLM2 and trains it (minutes on CPU)")
