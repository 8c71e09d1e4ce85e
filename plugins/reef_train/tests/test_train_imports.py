"""``import reef_train`` is cheap: its names import on first use, so the pytest plugin every pytest
process loads does not import torch; every public name still resolves, and a submodule named like
one of them (``rollout``) does not take its place."""

from __future__ import annotations

import subprocess
import sys

import reef_train


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_and_its_pytest_plugin_imports_no_torch():
    assert _run("import sys, reef_train, reef_train.pytest_plugin; print('torch' in sys.modules)") == "False"
    assert _run("import sys, reef_train; reef_train.LoraOptions; print('torch' in sys.modules)") == "False"


def test_every_public_name_resolves_and_a_same_named_submodule_does_not_replace_it():
    for name in reef_train.__all__:
        assert getattr(reef_train, name) is not None, name
    # the submodule imported first, then the name: still the function, as with eager imports
    assert _run("from reef_train.rollout import rollout as f\nimport reef_train\n"
                "from reef_train import rollout\nprint(rollout is f and reef_train.rollout is f)") == "True"
    try:
        reef_train.not_a_name  # noqa: B018
    except AttributeError as exc:
        assert "has no attribute 'not_a_name'" in str(exc)
    else:
        raise AssertionError("an unknown name must be an AttributeError")
