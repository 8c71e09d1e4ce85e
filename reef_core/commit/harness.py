"""The harness surface: what a harness release adds to every request it serves.

A harness artifact holds ``harness/system.md`` (the system prompt), ``harness/rules.md``
(rules the agent must follow), ``harness/skills/<name>/SKILL.md`` (skills, announced to the
model as a catalogue of name + description) and ``harness/config.json`` (settings for
client-side harnesses; carried by the install script, not interpreted here).

Server-side the harness becomes one text block placed in front of the client's own system
prompt: an OpenAI ``system`` message, the Anthropic ``system`` field, or the Responses API's
``instructions``. Parsing happens once
per release (``HarnessCache``), never on the request path.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..types import ActiveRelease
from .artifacts import ArtifactError, artifact_files, sha256_file

log = logging.getLogger("reef.commit")

_FRONTMATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n?", re.DOTALL)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str


@dataclass(frozen=True)
class Harness:
    """A parsed harness tree."""

    system: str = ""
    rules: str = ""
    skills: tuple[Skill, ...] = ()
    config: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return not (self.system or self.rules or self.skills)

    def prompt(self) -> str:
        """The text block injected in front of the client's system prompt."""
        parts = []
        if self.system:
            parts.append(self.system)
        if self.rules:
            parts.append("# Rules\n\n" + self.rules)
        if self.skills:
            lines = "\n".join(f"- {s.name}: {s.description}" if s.description else f"- {s.name}"
                              for s in self.skills)
            parts.append("# Skills\n\nSkills available to you (name: when to use it):\n" + lines)
        return "\n\n".join(parts)


def read_harness(harness_dir: Path | None) -> Harness:
    """Parse a ``harness/`` directory (missing files are simply absent parts)."""
    if harness_dir is None or not harness_dir.is_dir():
        return Harness()

    def text(name: str) -> str:
        p = harness_dir / name
        return p.read_text(encoding="utf-8").strip() if p.is_file() else ""

    skills = []
    skills_dir = harness_dir / "skills"
    if skills_dir.is_dir():
        for d in sorted(p for p in skills_dir.iterdir() if p.is_dir()):
            f = d / "SKILL.md"
            if f.is_file():
                skills.append(_skill(d.name, f.read_text(encoding="utf-8")))
    config = None
    cfg = harness_dir / "config.json"
    if cfg.is_file():
        config = json.loads(cfg.read_text(encoding="utf-8"))
    return Harness(system=text("system.md"), rules=text("rules.md"), skills=tuple(skills), config=config)


def check_harness(artifact_dir: Path) -> None:
    """Refuse an artifact whose harness cannot be served: text files that are not UTF-8, a
    ``config.json`` that is not a JSON object. Called before a candidate is evaluated."""
    harness_dir = Path(artifact_dir) / "harness"
    try:
        harness = read_harness(harness_dir)
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"harness text files must be UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"harness/config.json is not valid JSON: {exc}") from None
    if harness.config is not None and not isinstance(harness.config, dict):
        raise ArtifactError("harness/config.json must hold a JSON object")


def _skill(dirname: str, text: str) -> Skill:
    """Name and description from SKILL.md front matter (``name:``/``description:``), else the
    directory name and the first non-heading line."""
    name, description = dirname, ""
    m = _FRONTMATTER.match(text)
    body = text
    if m:
        body = text[m.end():]
        for line in m.group(1).splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "name" and value.strip():
                name = value.strip().strip("'\"")
            elif key.strip() == "description" and value.strip():
                description = value.strip().strip("'\"")
    if not description:
        description = next((ln.strip() for ln in body.splitlines()
                            if ln.strip() and not ln.lstrip().startswith("#")), "")
    return Skill(name=name, description=description[:300])


def inject(body: dict[str, Any], dialect: str, harness: Harness) -> dict[str, Any]:
    """A copy of ``body`` with the harness prompt in front of the client's system prompt."""
    if harness.empty:
        return body
    block = harness.prompt()
    out = copy.copy(body)
    if dialect == "responses":  # the Responses API's system prompt is ``instructions``
        instructions = body.get("instructions")
        out["instructions"] = block + "\n\n" + instructions if isinstance(instructions, str) and instructions \
            else block
        return out
    if dialect == "anthropic":
        system = body.get("system")
        if system is None or system == "":
            out["system"] = block
        elif isinstance(system, str):
            out["system"] = block + "\n\n" + system
        else:
            out["system"] = [{"type": "text", "text": block}, *system]
        return out
    messages = list(body.get("messages") or [])
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
        messages[0] = {**first, "content": block + "\n\n" + first["content"]}
    else:
        messages.insert(0, {"role": "system", "content": block})
    out["messages"] = messages
    return out


class HarnessCache:
    """Parsed harnesses by release, so the request path never reads files after the first use."""

    def __init__(self, size: int = 64):
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], Harness] = OrderedDict()

    def get(self, release: ActiveRelease) -> Harness:
        key = (release.release_id, str(release.path))
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        try:
            harness = read_harness(release.harness_dir)
        except Exception:  # checked before publishing; a damaged copy must not fail requests
            log.exception("cannot read the harness of release %s; serving it without a harness", release.release_id)
            harness = Harness()
        with self._lock:
            self._items[key] = harness
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return harness

    def apply(self, body: dict[str, Any], dialect: str, release: ActiveRelease) -> dict[str, Any]:
        """Inject ``release``'s harness into ``body`` (parsed once per release)."""
        return inject(body, dialect, self.get(release))


@dataclass(frozen=True)
class HarnessFile:
    """One file of a release's ``harness/`` tree: its path there, its bytes and their SHA-256."""

    path: str  # relative to harness/
    data: bytes
    sha256: str


#: the release id an installer records when the scenario had no release yet (settings only)
NO_RELEASE = "none"


@dataclass(frozen=True)
class HarnessBundle:
    """A release's ``harness/`` tree in memory: what harness adapters render into installers."""

    scenario: str
    release_id: str
    content_hash: str
    files: tuple[HarnessFile, ...]
    #: where agents reach this Reef (the URL the install request reached, without ``/v1``), and
    #: the model they should name; set by ``GET /reef/harness/install``, empty elsewhere
    base_url: str = ""
    model: str = ""
    #: what the server's upstream speaks (``runtime.dialect``); set by ``GET /reef/harness/install``
    runtime_dialect: str = ""

    def to_json(self) -> dict[str, Any]:
        """The tree for ``GET /reef/harness``: each file's path, size, sha256 and content
        (UTF-8 text, or base64 for binary files)."""
        items = []
        for f in self.files:
            item: dict[str, Any] = {"path": f.path, "size": len(f.data), "sha256": f.sha256}
            try:
                item["content"], item["encoding"] = f.data.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                item["content"], item["encoding"] = base64.b64encode(f.data).decode(), "base64"
            items.append(item)
        return {"scenario": self.scenario, "release_id": self.release_id,
                "content_hash": self.content_hash, "files": items}


def harness_bundle(release: ActiveRelease) -> HarnessBundle:
    """The ``harness/`` tree of a materialized release (empty when it has none)."""
    files = []
    if release.harness_dir is not None:
        for rel, p in artifact_files(release.harness_dir):
            files.append(HarnessFile(path=rel, data=p.read_bytes(), sha256=sha256_file(p)))
    return HarnessBundle(scenario=release.scenario, release_id=release.release_id,
                         content_hash=release.content_hash, files=tuple(files))
