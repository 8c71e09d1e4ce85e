"""Composing and validating Reef's configuration with Hydra's compose API.

No ``@hydra.main``: no cwd change, no output directories, no logging takeover. Plugins add
config groups through the ``reef_config_dir`` hook; their directories join the search path,
so an installed recipe's ``conf/recipe/<name>.yaml`` is selectable as ``recipe=<name>``.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import config_cache
from .errors import ConfigError
from .plugins import Plugins

PLUGIN_GROUPS = {
    "recipe": "recipe",
    "evaluator": "evaluator",
    "runtime": "runtime",
    "artifact_store": "artifact_store",
}

_SECRET_KEY = re.compile(r"(token|api_key|apikey|password|secret|authorization)", re.I)
#: the userinfo of a URL, up to its last ``@`` before the host (a password may hold ``@``)
_URL_USERINFO = re.compile(r"(?P<pre>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*)@", re.I)


#: a URL's query parameter that carries a secret (``?password=``, ``&api_key=``, ``?sig=``), up to its value
_URL_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_.-]*?(?:password|passwd|secret|token|api_?key|apikey)|key|sig|signature)=)"
    r"[^&#;\s]*", re.I)
#: ``user:password@`` without a ``scheme://`` before it (a mistyped URL, ``postgres//u:pw@h``)
_LOOSE_USERINFO = re.compile(r"(?P<pre>^|[\s/])(?P<user>[^/\s@:]*):[^/\s@]+@")


def _mask_userinfo(match: re.Match) -> str:
    """``user:secret@`` keeps the user; a lone ``token@`` or ``:token@`` is all secret."""
    user, sep, _ = match.group("userinfo").partition(":")
    return f"{match.group('pre')}{user}:****@" if sep and user else f"{match.group('pre')}****@"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8900, ge=0, le=65535)
    state_dir: str = Field(".reef", min_length=1)
    default_scenario: str = Field("default", min_length=1)
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    #: deepest nesting of objects and arrays accepted in a JSON body (anything stored must be
    #: readable back: records wrap bodies a few levels deeper, and serializers stop near 255)
    max_json_depth: int = Field(64, ge=2, le=200)
    #: request line plus headers, in bytes; larger requests get 431
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    #: a connection must deliver its request line and headers within this many seconds
    header_timeout_s: float = Field(10.0, gt=0)
    #: longest wait for the next piece of a request body before the request is dropped
    body_timeout_s: float = Field(30.0, gt=0)
    #: open connections at most; null: derived from the process's file-descriptor limit
    max_connections: int | None = Field(None, ge=1)
    #: scenarios that may exist (configured ones included); requests naming a new one past it get 403
    max_scenarios: int = Field(1000, ge=1)
    #: false: only configured scenarios (and those named in tokens) exist; others get 403
    scenarios_open: bool = True
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: worker processes behind the one port (``reef_core.serve.runner``), each a full kernel
    workers: int = Field(1, ge=1, le=64)
    #: allocations between collections of Python's youngest GC generation while serving
    #: (``reef_core.serve.gc_tuning``); null keeps Python's default (700)
    gc_young_threshold: int | None = Field(20_000, ge=100)
    #: host names served besides the bind address, localhost, 127.0.0.1 and [::1] (any IP
    #: address too on a 0.0.0.0 or :: bind): ``name`` (any port) or ``name:port``; ``*`` any
    #: host. Other ``Host`` headers get 421 (DNS rebinding; ``reef_core.serve.hosts``)
    allowed_hosts: list[str] = []
    #: on SIGTERM/SIGINT, requests in flight get this many seconds to finish; then what is left
    #: is cut (its client told, its record kept ``incomplete``) and the process exits
    shutdown_timeout_s: float = Field(10.0, ge=0)

    @field_validator("allowed_hosts")
    @classmethod
    def _known_host_forms(cls, value: list[str]) -> list[str]:
        from .serve.hosts import parse_allowed

        for entry in value:
            if entry.strip() != "*":
                parse_allowed(entry)
        return value


class TokenSettings(_Strict):
    token: str = Field(min_length=1)
    role: Literal["infer", "report", "admin"]
    scenarios: list[str] | None = None


class AuthSettings(_Strict):
    tokens: list[TokenSettings] = []


class RetentionSettings(_Strict):
    #: episodes of candidates created more than this many days ago are deleted (null: kept)
    episodes_days: float | None = Field(30, gt=0)
    #: reports older than this many days leave the pool and are removed (null: no age limit)
    max_age_days: float | None = Field(None, gt=0)
    #: per scenario, reports older than the newest this many leave the pool and are removed
    max_reports: int | None = Field(None, ge=1)


class LoopSettings(_Strict):
    enabled: bool = True
    schedule_s: float | None = Field(None, gt=0)
    #: a report (or record) is attempted by at most this many candidates, then stays consumed
    max_attempts: int = Field(3, ge=1)
    #: rejected experience is eligible again after this many new reports (null: the recipe's batch_size)
    retry_after_new: int | None = Field(None, ge=0)
    #: a growth step's lease on its scenario (``reef_core.grow.lease``) expires this many
    #: seconds after its holder's last renewal; the holder renews every third of it
    lease_ttl_s: float = Field(30.0, ge=1)
    #: while another process holds a scenario's lease, a pending trigger retries this often
    lease_poll_s: float = Field(2.0, gt=0)
    #: the divergence guard's KL bound: a weight recipe's learner lineage resets to the serving
    #: release when its head's KL to serving on the step's rollouts passes this many nats per
    #: token (null: no bound); docs/learning.md says why 0.1
    lineage_max_kl: float | None = Field(1.0, gt=0)
    retention: RetentionSettings = RetentionSettings()


class RecordStoreSettings(_Strict):
    url: str | None = None
    # SQLite only. "full": every commit is fsynced (survives power loss). "normal": a commit
    # survives a crash or SIGKILL of Reef but the last ones may be lost on power loss; it
    # saves one fsync (about 0.5 ms here) per commit.
    synchronous: Literal["full", "normal"] = "full"


#: what a scenario's learning loop does with its experience (``docs/modes.md``)
LearningMode = Literal["auto", "manual", "paused", "record_only"]
LEARNING_MODES: tuple[str, ...] = get_args(LearningMode)


class ScenarioSettings(_Strict):
    #: the scenario's learning mode until one is set through the API, the CLI or the dashboard
    #: (the stored one wins from then on, across restarts)
    mode: LearningMode = "auto"
    recipe_options: dict[str, Any] = {}
    evaluator: str | None = None
    evaluator_options: dict[str, Any] = {}
    filters: list[str] = []


class Settings(_Strict):
    """The validated shape of the root config (plugin groups are checked against their plugins)."""

    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    loop: LoopSettings = LoopSettings()
    scenarios: dict[str, ScenarioSettings] = {}
    recipe: dict[str, Any]
    evaluator: dict[str, Any]
    runtime: dict[str, Any]
    record_store: RecordStoreSettings
    artifact_store: dict[str, Any]

    @property
    def state_dir(self) -> Path:
        return Path(self.server.state_dir).expanduser().resolve()

    @property
    def record_store_url(self) -> str:
        url = self.record_store.url
        if url:
            return str(url)
        return f"sqlite:///{self.state_dir / 'reef.db'}"

    def evaluator_for(self, scenario: str) -> tuple[str | None, dict[str, Any]]:
        """(evaluator name, options) of ``scenario``, the one rule every caller uses:
        ``scenarios.<s>.evaluator`` with its ``evaluator_options`` when set; otherwise the root
        ``evaluator`` group with the scenario's ``evaluator_options`` over its options. A None
        name (``evaluator=recipe_default``) means the recipe's own ``default_evaluator``."""
        sc = self.scenarios.get(scenario)
        if sc is not None and sc.evaluator:
            return sc.evaluator, dict(sc.evaluator_options)
        name, options = self.group("evaluator")
        if sc is not None:
            options = {**options, **sc.evaluator_options}
        return name, options

    def open_record_store(self):
        """The configured ``RecordStore`` (opening it runs pending migrations)."""
        from .store import RecordStore

        return RecordStore(self.record_store_url, synchronous=self.record_store.synchronous)

    def group(self, group: str) -> tuple[str | None, dict[str, Any]]:
        """(plugin name, constructor options) of a plugin config group.

        Only ``evaluator`` may have no name: ``evaluator=recipe_default`` defers to the
        recipe's ``default_evaluator``.
        """
        data = dict(getattr(self, group))
        name = data.pop("name", None)
        if group == "runtime":  # a kernel-level key of every runtime, not a constructor option
            data.pop("model_aliases", None)
        if not name:
            if group == "evaluator":
                return None, data
            raise ConfigError(f"missing key {group}.name")
        return str(name), data


def conf_dir() -> Path:
    """The built-in config directory shipped in the reef-core wheel."""
    return Path(str(importlib.resources.files("reef_core.conf")))


def compose(overrides: list[str] | tuple[str, ...] = (), plugins: Plugins | None = None,
            config_file: str | Path | None = None) -> DictConfig:
    """Compose the config from the built-in conf, plugin conf dirs and ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if plugins is None:
        from .plugins import get_plugins

        plugins = get_plugins()
    overrides = list(overrides)
    for o in overrides:
        if o.startswith("hydra"):
            raise ConfigError(f"override {o!r} is not allowed: hydra.* keys are managed by Reef")
        if "=" not in o and not o.startswith("~"):  # Hydra's own words: "Error parsing override"
            raise ConfigError(f"{o!r} is not a config override: an override is KEY=VALUE (e.g. server.port=9000)")
    if not any(o.split("=", 1)[0].lstrip("+~") == "evaluator" for o in overrides):
        # evaluator=recipe_default has no keys of its own: `evaluator.tasks=...` are options of
        # the recipe's own evaluator, checked against it once the recipe is known (validate)
        overrides = [f"++{o}" if o.startswith("evaluator.") else o for o in overrides]
    plugin_dirs = [str(p) for _, p in plugins.config_dirs]
    if plugin_dirs:
        overrides.append(f"hydra.searchpath=[{','.join(f'file://{p}' for p in plugin_dirs)}]")
    root = str(conf_dir())

    def composed(given: list[str]) -> DictConfig:
        with initialize_config_dir(config_dir=root, version_base="1.3"):
            return hydra_compose("config", overrides=given)

    try:
        cfg = config_cache.compose(overrides, [root, *plugin_dirs], composed)
        if config_file is not None:
            extra = load_config_file(config_file)
            OmegaConf.set_struct(cfg, False)
            cfg = OmegaConf.merge(cfg, extra)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_unknown_key(exc) or _one_line(str(exc))) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config: {_one_line(str(exc))}") from None
    return cfg


def load_config_file(path: str | Path) -> DictConfig:
    """A config file as ``OmegaConf.load`` reads it, except that a key is always a string: YAML
    1.1 reads ``on``, ``off``, ``yes``, ``no``, ``y`` and ``n`` as booleans, keys included, and a
    misspelt key named ``on`` was refused as "invalid config key server.1: Keys should be
    strings" instead of being named. Values keep YAML 1.1's reading (``enabled: yes`` is true),
    as in Reef's own config files. A malformed file is one line naming what is wrong and where."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    base = get_yaml_loader()

    class Loader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:bool" and not key.style:
                    key.tag = "tag:yaml.org,2002:str"  # a plain key YAML 1.1 took for a boolean
            return super().construct_mapping(node, deep=deep)

    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.load(f, Loader=Loader)  # noqa: S506 - a SafeLoader, as OmegaConf.load's
        except yaml.MarkedYAMLError as exc:  # one line: what is wrong and where
            where = exc.problem_mark or exc.context_mark
            at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
            raise ConfigError(f"cannot read config {path}: {exc.problem or exc.context}{at}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"cannot read config {path}: {_one_line(str(exc))}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"cannot read config {path}: it holds a {type(data).__name__}, not a mapping of keys "
                          "(e.g. 'server:' and its keys below)")
    return OmegaConf.create(data)


def _unknown_key(exc: Exception) -> str | None:
    """The message of an override naming a key the composed config lacks, as ``validate`` words
    it for a config file ("unknown config key server.prot"); Hydra says "Could not override".
    Where the section takes keys its defaults do not list (a plugin's options, scenarios), the
    line says how to add one."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    found = re.match(r"Could not override '([^']+)'", str(exc))
    cause = exc.__cause__
    if found is None or not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) \
            or "not in struct" not in str(cause):
        return None
    key = found.group(1).lstrip("+~")
    field = Settings.model_fields.get(key.split(".")[0])
    if field is None or (isinstance(field.annotation, type) and issubclass(field.annotation, _Strict)):
        return f"unknown config key {key}"
    return f"unknown config key {key} (a key its defaults do not list takes a leading +: +{key}=…)"


def _one_line(message: str) -> str:
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else "invalid configuration"
    # Hydra lists the options on the following lines; keep them, compactly.
    if "Available options" in message:
        opts = []
        take = False
        for ln in lines[1:]:
            if ln.startswith("Available options"):
                take = True
                continue
            if ln.startswith("Config search path"):
                break
            if take:
                opts.append(ln)
        if opts:
            first += f" (available: {', '.join(opts)})"
    return first


def validate(cfg: DictConfig, plugins: Plugins | None = None, env: dict[str, str] | None = None) -> Settings:
    """Check ``cfg`` against the schema and the plugins it names; return typed settings."""
    if plugins is None:
        from .plugins import get_plugins

        plugins = get_plugins()
    data = OmegaConf.to_container(cfg, resolve=True)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"unknown config key {key}") from None
        raise ConfigError(f"invalid config key {key}: {err['msg']}") from None
    env = dict(os.environ if env is None else env)
    if env.get("REEF_TOKEN"):
        settings.auth.tokens.append(TokenSettings(token=env["REEF_TOKEN"], role="admin"))
    _check_tokens(settings.auth.tokens, from_env=bool(env.get("REEF_TOKEN")))
    if settings.state_dir.exists() and not settings.state_dir.is_dir():
        raise ConfigError(f"server.state_dir {settings.state_dir} is a file, not a directory")
    _check_scenario_names(settings)
    parse_model_aliases(settings.runtime.get("model_aliases"))  # its shape; targets are checked at start
    from .plugins import check_options

    checked: dict[str, tuple[str, dict[str, Any]]] = {}  # group → (plugin name, options) checked
    for group, kind in PLUGIN_GROUPS.items():
        name, options = settings.group(group)
        if name is None:
            recipe = plugins.get("recipe", settings.group("recipe")[0])
            name = getattr(recipe, "default_evaluator", None)
            if not isinstance(name, str):  # set per instance: checked when the loop builds it
                continue
        check_options(kind, name, options, plugins, prefix=group)
        checked[group] = (name, options)
    for sname, sc in settings.scenarios.items():
        # As the learning loop builds them: a scenario's options go over the root group's.
        if sc.recipe_options:
            name, options = checked["recipe"]
            check_options("recipe", name, {**options, **sc.recipe_options}, plugins,
                          prefix=f"scenarios.{sname}.recipe_options")
        if sc.evaluator or (sc.evaluator_options and "evaluator" in checked):
            name, options = settings.evaluator_for(sname)
            check_options("evaluator", name or checked["evaluator"][0], options, plugins,
                          prefix=f"scenarios.{sname}.evaluator_options")
        for f in sc.filters:
            plugins.get("record_filter", f)
    return settings


def _check_tokens(tokens: list[TokenSettings], *, from_env: bool) -> None:
    """A token given twice (REEF_TOKEN, ``from_env``, is the last) would take whichever role came
    first, and one of blanks can never be presented: both refused, by position, never by value."""
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        where = "REEF_TOKEN" if from_env and i == len(tokens) - 1 else f"auth.tokens.{i}"
        if not t.token.strip() or t.token != t.token.strip():
            raise ConfigError(f"{where}: a token cannot be blank or start or end with whitespace (a client sends "
                              "it in an Authorization header, which drops it)")
        if t.token in seen:
            raise ConfigError(f"{where}: the same token as auth.tokens.{seen[t.token]}; one token has one role "
                              "and one set of scenarios, so give each its own")
        seen[t.token] = i


def _check_scenario_names(settings: Settings) -> None:
    """Every scenario the config names (the default, configured ones, tokens' lists) must be one
    a request can name: the server would otherwise record under a name no route reaches."""
    from .names import scenario_name_problem

    named = [("server.default_scenario", settings.server.default_scenario)]
    named += [(f"scenarios.{name}", name) for name in settings.scenarios]
    named += [(f"auth.tokens.{i}.scenarios", name) for i, t in enumerate(settings.auth.tokens)
              for name in t.scenarios or ()]
    for where, name in named:
        problem = scenario_name_problem(name)
        if problem:
            raise ConfigError(f"{where}: {problem}")


def parse_model_aliases(raw: Any) -> dict[str, str]:
    """``runtime.model_aliases`` checked: a mapping of model names (strings) to model names."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"runtime.model_aliases must map client model names to served ones, e.g. "
                          f"'+runtime.model_aliases={{gpt-4o-mini: SmolLM2-135M-Instruct}}', not {raw!r}")
    aliases: dict[str, str] = {}
    for alias, target in raw.items():
        if not isinstance(alias, str) or not alias:
            raise ConfigError(f"runtime.model_aliases: {alias!r} is not a model name (a non-empty string)")
        if not isinstance(target, str) or not target:
            raise ConfigError(f"runtime.model_aliases.{alias} must name a served model (a non-empty string), "
                              f"not {target!r}")
        aliases[alias] = target
    return aliases


def load_settings(overrides: list[str] | tuple[str, ...] = (), plugins: Plugins | None = None,
                  config_file: str | Path | None = None) -> Settings:
    """Compose and validate in one step."""
    return validate(compose(overrides, plugins, config_file=config_file), plugins)


def is_secret_key(key: str) -> bool:
    """Whether a config key's value is a secret (a token, an API key, a password)."""
    return bool(_SECRET_KEY.search(key))


def mask_secrets(value: Any, key: str = "") -> Any:
    """A copy of ``value`` with every secret-looking key's value and URL password masked."""
    if isinstance(value, dict):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET_KEY.search(key) and value:
            return "****"
        return mask_url_text(value)
    return value


def mask_url_text(text: str) -> str:
    """``text`` with the passwords of the URLs in it masked: userinfo (``user:****@``), also
    without a scheme, and secret query parameters (``?password=****``)."""
    text = _URL_USERINFO.sub(_mask_userinfo, text)
    if ":" in text and "@" in text:
        text = _LOOSE_USERINFO.sub(lambda m: f"{m.group('pre')}{m.group('user')}:****@", text)
    if "=" in text:
        text = _URL_SECRET_PARAM.sub(lambda m: f"{m.group('name')}****", text)
    return text


def masked_yaml(cfg: DictConfig) -> str:
    data = OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(mask_secrets(data)))
