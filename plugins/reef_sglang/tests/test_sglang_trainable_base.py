"""The sglang runtime as a ``reef_core.TrainableBase``, from config alone (no engine, no GPU):
``runtime.base_model_path`` names a local copy of the weights the engine serves; without it
the capability reports its absence with the option to set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reef_core import ActiveRelease, ConfigError, ServedBase, TrainableBase, require_trainable, trainable_base
from reef_core.testing import build_configured, check_trainable_base
from reef_sglang import SGLangRuntime


def hf_dir(root: Path) -> Path:
    """The files of a Hugging Face model directory that the runtime reads (no weights needed)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 2, "dtype": "bfloat16"}))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>",
        "added_tokens_decoder": {"2": {"content": "</s>"}, "9": {"content": "<|im_end|>"}},
    }))
    return root


def test_without_base_model_path_the_capability_is_absent_and_says_what_to_set(tmp_path):
    rt = SGLangRuntime()
    assert isinstance(rt, TrainableBase)
    assert "runtime.base_model_path" in rt.trainable_problem()
    assert check_trainable_base(rt, tmp_path) is None
    assert trainable_base(rt) is None
    with pytest.raises(ConfigError) as err:
        require_trainable(rt, "sao")
    message = str(err.value)
    assert "'sao'" in message and "SGLangRuntime" in message and "runtime.base_model_path is not set" in message


def test_a_path_without_a_model_is_named(tmp_path):
    rt = SGLangRuntime(base_model_path=str(tmp_path / "nowhere"))
    assert "nowhere" in rt.trainable_problem() and "config.json" in rt.trainable_problem()
    assert check_trainable_base(rt, tmp_path / "kit") is None
    with pytest.raises(ConfigError, match="runtime.base_model_path="):
        rt.base_model()


def test_base_model_path_describes_the_served_weights_without_the_engine(tmp_path):
    model = hf_dir(tmp_path / "Qwen-tiny")
    rt = SGLangRuntime(base_url="http://127.0.0.1:9", base_model_path=str(model), base_model_device="cuda:1")
    base = check_trainable_base(rt, tmp_path / "kit")  # never starts the runtime: nothing listens on :9
    assert base == ServedBase(path=model.resolve(), model_id="Qwen-tiny", device="cuda:1", dtype="bfloat16",
                              eos_token_ids=(2, 7, 9))
    assert SGLangRuntime(model="served-name", base_model_path=str(model)).base_model().model_id == "served-name"
    assert trainable_base(rt) is rt and require_trainable(rt, "sao") is rt


def test_adapter_of_is_what_the_engine_loads(tmp_path):
    rt = SGLangRuntime(base_model_path=str(hf_dir(tmp_path / "m")))
    path = tmp_path / "rel"
    (path / "adapter").mkdir(parents=True)
    (path / "adapter" / "adapter_config.json").write_text("{}")
    assert rt.adapter_of(ActiveRelease(scenario="s", release_id="r1", path=path)) == path / "adapter"
    assert rt.adapter_of(ActiveRelease(scenario="s", release_id="r0")) is None
    assert rt.adapter_of(None) is None


def test_the_options_come_from_config(tmp_path):
    model = hf_dir(tmp_path / "m")
    rt = build_configured("runtime", ["runtime=sglang", f"runtime.base_model_path={model}",
                                      "runtime.base_model_device=cpu"])
    assert isinstance(rt, SGLangRuntime)
    assert rt.base_model().path == model.resolve() and rt.base_model().device == "cpu"
    assert build_configured("runtime", ["runtime=sglang"]).trainable_problem() is not None
    with pytest.raises(ConfigError, match="base_model_path"):
        build_configured("runtime", ["runtime=sglang", "runtime.base_model_path=3"])
