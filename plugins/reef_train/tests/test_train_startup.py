"""``refuse_untrainable_runtime``: the start-up check sao, openclaw and tttd share (skipped where
reef-core is not installed: the rest of reef-train runs without it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

reef_core = pytest.importorskip("reef_core")
from reef_core.testing import EchoRuntime  # noqa: E402
from reef_train.startup import refuse_untrainable_runtime  # noqa: E402


def _reef(runtime, recipe="tttd", options=None, learning=True):
    groups = {"recipe": (recipe, options or {}), "runtime": ("upstream", {})}
    return SimpleNamespace(learning=object() if learning else None, runtime=runtime,
                           settings=SimpleNamespace(group=groups.__getitem__))


def test_an_untrainable_runtime_is_one_config_error_naming_recipe_and_runtime(trainable_runtime):
    with pytest.raises(reef_core.ConfigError) as err:
        refuse_untrainable_runtime(_reef(EchoRuntime()), "tttd", note="; variant=search-only needs no training")
    message = str(err.value)
    assert message.startswith("recipe 'tttd' trains against the served base model")
    assert message.endswith("(configured: runtime=upstream; variant=search-only needs no training)")
    assert refuse_untrainable_runtime(_reef(trainable_runtime), "tttd") is True


def test_other_recipes_no_learning_and_exempt_configurations_are_left_alone():
    untrainable = EchoRuntime()
    assert refuse_untrainable_runtime(_reef(untrainable, recipe="basic"), "tttd") is False
    assert refuse_untrainable_runtime(_reef(untrainable, learning=False), "tttd") is False
    search_only = _reef(untrainable, options={"variant": "search-only"})
    assert refuse_untrainable_runtime(search_only, "tttd", exempt=lambda o: o.get("variant") == "search-only") is False


def test_lineages_without_a_state_directory_leave_no_directory_behind():
    import gc

    from reef_train.lineage import lineages_in

    lineages = lineages_in(None)
    root = lineages.root.parent  # the temporary state directory
    assert root.is_dir() and root.name.startswith("reef-lineage-")
    del lineages
    gc.collect()
    assert not root.exists()
