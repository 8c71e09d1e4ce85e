"""The plugin wiring: entry point, config group, constructor schema, kernel instantiation."""

from __future__ import annotations

import importlib.metadata
import inspect
from pathlib import Path

import yaml

from reef_torch import LocalRuntime
from reef_torch import plugin as torch_plugin


def test_entry_point_and_hooks():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="reef")}
    assert eps.get("torch") == "reef_torch.plugin"
    registered = {}
    torch_plugin.register_runtimes(lambda name, cls: registered.setdefault(name, cls))
    assert registered == {"local": LocalRuntime}
    conf = Path(torch_plugin.reef_config_dir())
    assert conf.is_absolute() and (conf / "runtime" / "local.yaml").is_file()


def test_config_group_matches_the_constructor():
    conf = Path(torch_plugin.reef_config_dir()) / "runtime" / "local.yaml"
    options = yaml.safe_load(conf.read_text())
    assert options.pop("name") == "local"
    params = inspect.signature(LocalRuntime).parameters
    assert set(options) == set(params)
    for key, value in options.items():
        assert params[key].default == value, key
    assert LocalRuntime.dialect == "openai"


def test_kernel_composes_and_instantiates_runtime_local():
    from reef_core.testing import build_configured

    rt = build_configured("runtime", ["runtime=local", "runtime.max_batch_size=4"], env={"REEF_PLUGINS": "torch"},
                          state_dir=Path("."))
    assert isinstance(rt, LocalRuntime) and rt.max_batch_size == 4 and rt.engine is None  # nothing loaded yet
