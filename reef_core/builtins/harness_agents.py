"""Harness adapters for coding agents: ``claude`` (Claude Code), ``codex`` (Codex CLI) and
``opencode``.

Each renders a release into the files its agent reads in a project directory, plus the
agent's own configuration pointing it at this Reef with the scenario header, and installs
them with the ``files`` adapter's checksum-verified installer (``sh install.sh [DIR]``, DIR
defaulting to the current directory):

=========  =========================================  ==========================================
adapter    instructions (system prompt + rules)        skills / settings
=========  =========================================  ==========================================
claude     ``CLAUDE.md``                               ``.claude/skills/<name>/SKILL.md``,
                                                       ``.claude/settings.json``
codex      ``AGENTS.md``                               ``.codex/skills/<name>/SKILL.md``,
                                                       ``.codex/config.toml`` (``CODEX_HOME``)
opencode   ``AGENTS.md``                               ``.opencode/skills/<name>/SKILL.md``,
                                                       ``opencode.json``
=========  =========================================  ==========================================

No token is written into any of these files (a project may commit them): each agent reads it
from ``REEF_TOKEN`` when it runs. ``reef agent run`` adds ``x-reef-session`` (from
``REEF_SESSION``) so one run's turns form one session. Each agent's settings send
``x-reef-installed-release`` with the release installed: while that release serves, Reef does
not inject its harness again (the agent already sends it from its instructions file).

The three live side by side in one project: each adapter keeps its own manifest and record
(``.reef-harness-<adapter>.sha256``, ``.reef-harness-<adapter>-release``), and Codex and
opencode, which both read ``AGENTS.md``, render it identically from the same release.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from ..commit.harness import HarnessBundle, HarnessFile
from ..hookspecs import hookimpl
from .harness_files import FilesAdapter

#: the agents that read ``AGENTS.md`` (it must be the same file for each)
SHARED_AGENTS = ("codex", "opencode")


def installed_headers(bundle: HarnessBundle) -> dict[str, str]:
    """The headers every request of an agent installed from ``bundle`` carries: its scenario,
    and the release it installed (``x-reef-installed-release``; none before the first release)."""
    from ..commit.harness import NO_RELEASE

    headers = {"x-reef-scenario": bundle.scenario}
    if bundle.release_id and bundle.release_id != NO_RELEASE:
        headers["x-reef-installed-release"] = bundle.release_id
    return headers


def _text(bundle: HarnessBundle, path: str) -> str:
    found = next((f for f in bundle.files if f.path == path), None)
    return found.data.decode("utf-8", "replace").strip() if found is not None else ""


def instructions(bundle: HarnessBundle, agent: str) -> str:
    """The release's system prompt and rules as one instructions file, ending with the release
    it came from (a plain line, not a comment: agents strip HTML comments, and the line is how a
    record shows which installed release the agent was working from). ``AGENTS.md`` is shared by
    Codex and opencode, so its text names no one agent: either's install writes the same bytes."""
    parts = []
    system, rules = _text(bundle, "system.md"), _text(bundle, "rules.md")
    if system:
        parts.append(system)
    if rules:
        parts.append("# Rules\n\n" + rules)
    update = "`reef agent update codex` or `reef agent update opencode`" if agent in SHARED_AGENTS \
        else f"`reef agent update {agent}`"
    parts.append(f"Installed by Reef from scenario {bundle.scenario}, release {bundle.release_id} "
                 f"({update} installs newer releases).")
    return "\n\n".join(parts) + "\n"


def _file(path: str, data: str | bytes) -> HarnessFile:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return HarnessFile(path=path, data=raw, sha256=hashlib.sha256(raw).hexdigest())


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class AgentAdapter(FilesAdapter):
    """A release rendered into an agent's project layout, installed by the ``files`` installer.

    Subclasses name the instructions file, the skills directory and add the agent's settings
    (``settings``)."""

    default_dest = "."

    @property
    def manifest(self) -> str:  # type: ignore[override]
        return f".reef-harness-{self.adapter_name}.sha256"

    @property
    def sidecar(self) -> str:  # type: ignore[override]
        return f".reef-harness-{self.adapter_name}-release"

    #: the agent's command
    binary = ""
    #: the file the agent reads its project instructions from
    instructions_file = "AGENTS.md"
    #: where the agent finds skills, relative to the project directory
    skills_dir = ""

    def settings(self, bundle: HarnessBundle) -> dict[str, str]:
        """The agent's configuration files (path → text) pointing it at ``bundle.base_url``."""
        return {}

    def layout(self, bundle: HarnessBundle) -> HarnessBundle:
        """``bundle`` with its files laid out as the agent reads them."""
        files = [_file(self.instructions_file, instructions(bundle, self.adapter_name))]
        for f in bundle.files:
            if f.path.startswith("skills/"):
                files.append(replace(f, path=f"{self.skills_dir}/{f.path[len('skills/'):]}"))
        files += [_file(path, text) for path, text in self.settings(bundle).items()]
        return replace(bundle, files=tuple(sorted(files, key=lambda f: f.path)))

    def render(self, bundle: HarnessBundle) -> str:
        return super().render(self.layout(bundle))


class ClaudeAdapter(AgentAdapter):
    """Claude Code: ``CLAUDE.md``, ``.claude/skills/``, ``.claude/settings.json``."""

    adapter_name = "claude"
    binary = "claude"
    description = "Claude Code: CLAUDE.md, .claude/skills/<name>/SKILL.md, .claude/settings.json"
    instructions_file = "CLAUDE.md"
    skills_dir = ".claude/skills"
    config_dirs = (".claude",)

    def settings(self, bundle: HarnessBundle) -> dict[str, str]:
        env = {"ANTHROPIC_BASE_URL": bundle.base_url,
               "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in installed_headers(bundle).items())}
        if bundle.model:
            env["ANTHROPIC_MODEL"] = bundle.model
            env["ANTHROPIC_SMALL_FAST_MODEL"] = bundle.model
        # the key is read from the environment each time Claude Code needs it: never stored here
        settings = {"env": env, "apiKeyHelper": "printf '%s' \"${REEF_TOKEN:-none}\""}
        return {".claude/settings.json": json.dumps(settings, indent=2) + "\n"}


class CodexAdapter(AgentAdapter):
    """Codex CLI: ``AGENTS.md``, and ``.codex/`` as ``CODEX_HOME`` (``config.toml``, ``skills/``)."""

    adapter_name = "codex"
    binary = "codex"
    description = "Codex CLI: AGENTS.md, .codex/config.toml (a Reef provider, wire_api=responses), .codex/skills/"
    skills_dir = ".codex/skills"
    config_dirs = (".codex",)

    def settings(self, bundle: HarnessBundle) -> dict[str, str]:
        lines = ["# Written by Reef's codex adapter. Run Codex with CODEX_HOME set to this directory",
                 "# (`reef agent run codex` does); the token comes from REEF_TOKEN.",
                 'model_provider = "reef"']
        if bundle.runtime_dialect == "responses":
            # Reef carries everything Codex sends to a Responses upstream (custom tools,
            # additional_tools, hosted web search): Codex's own model unless Reef serves one
            if bundle.model:
                lines.append(f"model = {_toml(bundle.model)}")
        else:
            # Always a model: for names it knows (gpt-*), Codex sends item and tool types only
            # OpenAI's service understands (additional_tools items, custom tools)
            lines.append(f"model = {_toml(bundle.model or 'default')}")
            lines += ['# Reef serves no built-in tools (web search runs only on OpenAI\'s service)',
                      'web_search = "disabled"']
        lines += [
            "",
            "[model_providers.reef]",
            'name = "Reef"',
            f"base_url = {_toml(bundle.base_url + '/v1')}",
            'wire_api = "responses"',
            'env_key = "REEF_TOKEN"',
            "http_headers = { " + ", ".join(f"{_toml(k)} = {_toml(v)}"
                                            for k, v in installed_headers(bundle).items()) + " }",
            'env_http_headers = { "x-reef-session" = "REEF_SESSION" }',
        ]
        return {".codex/config.toml": "\n".join(lines) + "\n"}


class OpencodeAdapter(AgentAdapter):
    """opencode: ``AGENTS.md``, ``.opencode/skills/``, ``opencode.json`` with a Reef provider."""

    adapter_name = "opencode"
    binary = "opencode"
    description = "opencode: AGENTS.md, opencode.json (a Reef provider), .opencode/skills/<name>/SKILL.md"
    skills_dir = ".opencode/skills"
    config_dirs = (".opencode",)

    def settings(self, bundle: HarnessBundle) -> dict[str, str]:
        model = bundle.model or "default"
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"reef": {
                "npm": "@ai-sdk/openai-compatible", "name": "Reef",
                "options": {"baseURL": bundle.base_url + "/v1", "apiKey": "{env:REEF_TOKEN}",
                            "headers": {**installed_headers(bundle), "x-reef-session": "{env:REEF_SESSION}"}},
                "models": {model: {"name": model}},
            }},
            "model": f"reef/{model}",
        }
        return {"opencode.json": json.dumps(config, indent=2) + "\n"}


AGENT_ADAPTERS = (ClaudeAdapter, CodexAdapter, OpencodeAdapter)


@hookimpl
def register_harness_adapters(register: Any) -> None:
    for cls in AGENT_ADAPTERS:
        register(cls.adapter_name, cls)
