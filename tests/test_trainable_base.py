"""``reef_core.TrainableBase``: the capability a weight recipe asks a runtime for, and the clear
error when the runtime lacks it (a recipe never imports a runtime's package)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from reef_core import ActiveRelease, ConfigError, ServedBase, TrainableBase, require_trainable, trainable_base
from reef_core.protocols import _call, conform
from reef_core.testing import EchoRuntime, check_trainable_base

PLUGINS_MD = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()


class DuckRuntime:
    """A runtime without subclassing ``Runtime`` (the kernel wraps it), offering the capability."""

    def __init__(self, model_dir: Path | None):
        self.model_dir = model_dir

    async def complete(self, call):
        return {}

    async def stream(self, call):
        yield {}

    def trainable_problem(self):
        return None if self.model_dir else "runtime.weights is not set; set it to the served model's directory."

    def base_model(self):
        if self.model_dir is None:
            raise ConfigError(self.trainable_problem())
        return ServedBase(path=self.model_dir.resolve(), model_id="duck", device="cpu", eos_token_ids=(2,))

    def adapter_of(self, release):
        return release.adapter_dir if release is not None else None


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "tokenizer_config.json").write_text("{}")
    return root


def test_a_runtime_without_the_capability_gets_a_clear_message():
    runtime = EchoRuntime()
    assert not isinstance(runtime, TrainableBase)
    assert trainable_base(runtime) is None
    with pytest.raises(ConfigError) as err:
        require_trainable(runtime, "sao")
    message = str(err.value)
    assert message.startswith("recipe 'sao' trains against the served base model, but the runtime (EchoRuntime)")
    assert "reef_core.TrainableBase" in message and "runtime=local" in message and "runtime.base_model_path" in message
    with pytest.raises(AssertionError, match="lacks TrainableBase"):
        check_trainable_base(runtime, Path("unused"))


def test_a_configured_problem_is_the_message(tmp_path):
    runtime = conform("runtime", DuckRuntime(None))  # as the kernel holds it
    assert trainable_base(runtime) is None
    with pytest.raises(ConfigError, match=r"runtime \(DuckRuntime\) cannot provide it: runtime.weights is not set"):
        require_trainable(runtime, "sao")
    assert check_trainable_base(runtime, tmp_path) is None


def test_a_wrapped_duck_typed_runtime_offers_it(tmp_path):
    inner = DuckRuntime(model_dir(tmp_path / "model"))
    runtime = conform("runtime", inner)
    assert trainable_base(runtime) is inner and require_trainable(runtime, "sao") is inner
    base = check_trainable_base(runtime, tmp_path / "kit")
    assert base.path == (tmp_path / "model").resolve() and base.dtype is None
    release = ActiveRelease(scenario="s", release_id="r", path=tmp_path / "kit" / "adapter-release")
    assert inner.adapter_of(release) == release.adapter_dir


def test_the_kit_catches_a_broken_promise(tmp_path):
    class NoAdapters(DuckRuntime):
        def adapter_of(self, release):
            return None

    with pytest.raises(AssertionError, match="adapter_of\\(a release with adapter/\\)"):
        check_trainable_base(NoAdapters(model_dir(tmp_path / "model")), tmp_path / "kit")


def test_served_base_is_a_frozen_value(tmp_path):
    base = ServedBase(path=tmp_path, model_id="m")
    assert (base.device, base.dtype, base.eos_token_ids) == ("auto", None, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.model_id = "other"  # type: ignore[misc]


def test_docs_list_every_member_and_field():
    table = PLUGINS_MD[PLUGINS_MD.index("| capability | of | members | ask with |"):]
    row = re.search(r"^\| `reef_core.TrainableBase`.*$", table, re.M).group(0)
    members = [name for name in vars(TrainableBase) if not name.startswith("_")]
    assert sorted(members) == ["adapter_of", "base_model", "trainable_problem"]
    for name in members:
        assert _call(TrainableBase, name) in row, name
    for field in dataclasses.fields(ServedBase):
        assert f"`{field.name}`" in PLUGINS_MD, field.name
