"""Every shell command of the README and docs/ runs, or is on a reviewed list saying why not.

Each fenced ``sh``/``bash``/``shell``/``console`` block is split into commands (a trailing
backslash continues a line; comment-only lines are not commands). A command is then:

- skipped, when ``SKIPS`` names it with the reason (it needs the network, a provider key, a GPU
  host, installs packages, runs for minutes, or another test runs it); a reason that no longer
  matches any command fails, so the list stays reviewed;
- ``export ...``: run, so the block's later commands see what it sets;
- ``reef serve`` (and ``scripts/serve``, which is ``reef serve`` with its own overrides): a
  server runs until stopped, so its configuration is composed and checked instead, as
  ``reef serve --cfg job`` does (every key, value and plugin it names; exit 0);
- any other ``reef`` command: run as written, against a live Reef (``REEF_URL``) where it
  talks to a server.

Commands run in bash, as a reader's shell runs them, in a fresh directory; ``reef`` and
``.venv/bin/reef`` are this checkout's. A command that exits non-zero fails with its output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from reef_core.testing import FakeUpstream, ReefServer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: what the environment holds for the docs' placeholders: a provider key the pages pass by name,
#: and the database URL a skipped `export REEF_DATABASE_URL=$(scripts/postgres.sh)` would set
DOC_ENV = {"OPENAI_API_KEY": "sk-docs-test", "REEF_DATABASE_URL": "postgresql+psycopg://reef@127.0.0.1:55432/reef"}

#: (page, the command's start, why it does not run here): reviewed, each must still match
SKIPS: tuple[tuple[str, str, str], ...] = (
    ("README.md", "scripts/test", "runs the whole test suite, this test included"),
    ("README.md", ".venv/bin/reef demo", "minutes on the embedded model: tests/test_demo.py runs `reef demo --quick` "
                                         "(slow)"),
    ("docs/demo.md", ".venv/bin/reef demo [", "the command's synopsis, with its options in brackets"),
    ("docs/agents.md", "npm install -g", "downloads an agent CLI (network); scripts/agent-clis.sh pins them"),
    ("docs/agents.md", "reef agent ", "runs the real agent CLIs: tests/loop/test_agents_docs.py runs these blocks "
                                      "(slow)"),
    ("docs/bench.md", "python bench/", "a benchmark: minutes to hours on the embedded model (the page has what "
                                       "it measured)"),
    ("docs/bench.md", "REEF_UPSTREAM_API_KEY=", "a benchmark against a real provider (network, a key)"),
    ("docs/recipes/gepa.md", "REEF_REFLECTION_API_KEY=", "a benchmark against a real provider (network, a key)"),
    ("docs/serving.md", "python bench/soak.py", "a soak benchmark: ten minutes by design"),
    ("docs/configuration.md", "reef serve -c deploy.yaml", "names the operator's own file"),
    ("docs/learning.md", "reef serve recipe=feedback_rules evaluator=task_suite",
     "names the operator's own tasks.yaml"),
    ("docs/deploy.md", "scripts/setup.sh", "installs system packages and the virtual environment"),
    ("docs/deploy.md", "export REEF_DATABASE_URL=$(scripts/postgres.sh)",
     "starts a PostgreSQL server (the tests get theirs from scripts/test); DOC_ENV holds what it prints"),
    ("docs/deploy.md", "scripts/postgres.sh --stop", "stops the PostgreSQL server the line above started"),
    ("docs/plugins.md", "pip install", "installs a package into the environment"),
    ("docs/plugins.md", "reef plugins                      # few_shot",
     "needs the example plugin the line above installs"),
    ("docs/plugins.md", "reef serve recipe=few_shot", "needs the example plugin installed"),
    ("docs/recipes/gepa.md", "pip install", "installs packages (network)"),
    ("docs/recipes/gepa.md", "reef serve recipe=gepa --config reef.yaml",
     "reef.yaml is the page's example, in front of a real provider; tests/test_docs_recipes.py runs its client"),
    ("docs/recipes/skillclaw.md", "pip install", "installs packages (network)"),
    ("docs/recipes/skillclaw.md", "reef serve recipe=skillclaw --config reef.yaml",
     "names the operator's own reef.yaml (its evaluator.tasks)"),
    ("docs/serving.md", "pip install", "installs packages (network)"),
    ("docs/serving.md", "python examples/quickstart_", "talks to the line above's server in front of OpenAI (a "
                                                       "real key): tests/serve/test_examples.py runs the quickstarts"),
)


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    #: the `export` commands before it in its block
    exports: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def commands() -> list[Command]:
    found = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        page = str(path.relative_to(ROOT))
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            exports: list[str] = []
            joined, start = "", None
            for offset, raw in enumerate(block.group(1).splitlines()):
                if start is None:
                    start = first + offset
                if raw.rstrip().endswith("\\"):
                    joined += raw.rstrip()[:-1] + " "
                    continue
                line, joined = (joined + raw).strip(), ""
                begin, start = start, None
                if not line or line.startswith("#"):
                    continue
                found.append(Command(page, begin, line, tuple(exports)))
                if line.startswith("export "):
                    exports.append(line)
    return found


def skip_reason(command: Command) -> str | None:
    return next((why for page, start, why in SKIPS if command.page == page and command.text.startswith(start)), None)


def serve_overrides() -> list[str]:
    """The overrides ``scripts/serve`` passes to ``reef serve`` before the caller's."""
    line = next(ln for ln in (ROOT / "scripts" / "serve").read_text().splitlines() if ln.startswith("exec "))
    return shlex.split(line)[3:-1]


def as_run(command: Command) -> str:
    """The shell line to run for ``command``: a server's is its configuration's check."""
    text = re.sub(r"(^|\s)\.venv/bin/reef\b", r"\1reef", command.text)
    if text.startswith("scripts/serve"):
        text = "reef serve " + " ".join(map(shlex.quote, serve_overrides())) + text[len("scripts/serve"):]
    if re.match(r"(\w+=\S* )*reef serve\b", text) and "--cfg" not in text:
        text = text.replace("reef serve", "reef serve --cfg job", 1)
    return text


ALL = commands()
#: exports are not run alone: they run before their block's later commands
RUNNABLE = [c for c in ALL if skip_reason(c) is None and not c.text.startswith("export ")]


def test_the_pages_have_commands_and_every_skip_still_names_one():
    assert len(ALL) > 30 and any(c.page == "README.md" for c in RUNNABLE)
    stale = [(page, start) for page, start, _ in SKIPS
             if not any(c.page == page and c.text.startswith(start) for c in ALL)]
    assert stale == [], "skips that match no command any more (remove or fix them)"


def test_a_server_command_is_checked_by_composing_its_configuration():
    readme = next(c for c in ALL if c.page == "README.md" and c.text == "scripts/serve")
    assert as_run(readme).startswith("reef serve --cfg job runtime=local recipe=feedback_rules")
    assert as_run(Command("x", 1, "REEF_X=1 reef serve a=b", ())) == "REEF_X=1 reef serve --cfg job a=b"
    assert as_run(Command("x", 1, ".venv/bin/reef releases", ())) == "reef releases"


@pytest.fixture(scope="module")
def live_reef(tmp_path_factory):
    """A Reef the commands that talk to a server reach (``REEF_URL``)."""
    tmp = tmp_path_factory.mktemp("docs-reef")
    with FakeUpstream("openai", lambda body: "ok") as up, ReefServer(tmp, upstream=up) as reef:
        yield reef


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory, live_reef):
    """PATH with this checkout's ``reef`` first; the docs' placeholders; the live Reef's URL."""
    bin_dir = tmp_path_factory.mktemp("docs-bin")
    shim = bin_dir / "reef"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m reef_core "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, **DOC_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "REEF_URL": live_reef.url}


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.id for c in RUNNABLE])
def test_the_command_runs(command, shell_env, tmp_path):
    script = "\n".join(["set -e", *command.exports, as_run(command)])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=shell_env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{command.id}: {command.text}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
