"""The GGUF conversion cache is written atomically: a crash leaves no half directory, and
conversions that start at once take turns, so the model is converted once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers

from reef_torch import model_loading
from reef_torch.model_loading import (
    MARKER,
    ModelLoadError,
    convert_gguf,
    resolve_dtype,
    resolve_model_dir,
)


class FakeModel:
    def __init__(self, crash: bool):
        self.crash = crash
        self.hf_quantizer = object()
        self.config = SimpleNamespace(quantization_config={"quant_method": "gguf"})

    def save_pretrained(self, path, **kwargs):
        assert self.hf_quantizer is None and not hasattr(self.config, "quantization_config")
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"half")
        if self.crash:
            raise OSError("disk full")


class FakeTokenizer:
    def save_pretrained(self, path, **kwargs):
        (Path(path) / "tokenizer.json").write_text("{}")


@pytest.fixture
def fake_loaders(monkeypatch):
    state = {"crash": True}
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: FakeTokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: FakeModel(state["crash"]))
    return state


def test_crash_mid_conversion_leaves_no_cache_then_retry_completes(tmp_path, fake_loaders):
    gguf = tmp_path / "src" / "Model.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    target = tmp_path / "cache" / "model"
    with pytest.raises(OSError, match="disk full"):
        convert_gguf(gguf, target)
    assert not target.exists()
    # the temporary directory is gone too (the lock file stays: removing it would race its next user)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".model.lock"]

    fake_loaders["crash"] = False
    assert convert_gguf(gguf, target) == target
    assert (target / MARKER).is_file() and (target / "tokenizer.json").is_file()
    fake_loaders["crash"] = True  # a complete cache is reused, never converted again
    assert convert_gguf(gguf, target) == target


def test_conversions_started_at_once_convert_once(tmp_path, monkeypatch):
    gguf = tmp_path / "src" / "Model.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    target = tmp_path / "cache" / "model"
    loads = []

    def slow_load(*args, **kwargs):  # long enough that every thread passes the first cache check
        loads.append(threading.get_ident())
        time.sleep(0.5)
        return FakeModel(crash=False)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: FakeTokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", slow_load)
    start, results = threading.Barrier(4), []

    def convert():
        start.wait()
        results.append(convert_gguf(gguf, target))

    threads = [threading.Thread(target=convert) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target] * 4 and len(loads) == 1
    assert (target / MARKER).is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]


def test_embedded_model_uses_the_env_cache_dir(tmp_path, monkeypatch, fake_loaders):
    gguf = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"1234")
    fake_loaders["crash"] = False
    monkeypatch.setattr(model_loading, "embedded_gguf", lambda: gguf)
    monkeypatch.setenv("REEF_MODEL_CACHE", str(tmp_path / "envcache"))
    path, model_id = resolve_model_dir(None)
    assert path == tmp_path / "envcache" / "smollm2-135m-instruct.q4_1-4" and model_id == "SmolLM2-135M-Instruct"
    path2, _ = resolve_model_dir("smollm2", cache_dir=tmp_path / "explicit")
    assert path2.parent == tmp_path / "explicit"


def test_bad_options_are_clear(tmp_path):
    with pytest.raises(ModelLoadError, match="never downloads"):
        resolve_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelLoadError, match="dtype"):
        resolve_dtype("float33", "cpu")


def test_a_conversion_parses_the_gguf_once_and_builds_each_name_table_once(tmp_path):
    """Transformers opens the GGUF once for the config, once for the tokenizer and once for the
    weights, and asks gguf for the tensor-name table once per module: within a conversion each
    is built once (the reader from a plain array over the file's memory map, parsing what gguf's
    own reader parses), and gguf is left as it was after it."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with model_loading._gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # how transformers calls it, three times
        assert isinstance(first, reader_class) and first.fields["general.architecture"].contents() == "llama"
        # parsed from a plain array over the memory map (slicing an np.memmap costs a Python call)
        assert type(first.data) is np.ndarray and isinstance(first.data.base, np.memmap)
        plain = reader_class(path)
        assert {k: f.contents() for k, f in first.fields.items()} == {k: f.contents() for k, f in plain.fields.items()}
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
        assert table.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert gguf.GGUFReader(path) is not first
