"""Loading plugins and collecting what they register.

Built-in plugins (``reef_core/builtins/``) and third-party ones (entry-point group ``reef``)
go through the same path: each module is registered with pluggy, then every
``register_*`` hook implementation is called *one plugin at a time* so anything it
registers is attributed to it. Entry points are loaded one by one (not with
``load_setuptools_entrypoints``) so a broken plugin is reported by name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError
from .protocols import HOOK_FOR_KIND, KINDS, conform, missing_members


def builtin_modules() -> list[str]:
    """Every module in ``reef_core.builtins``: each is a plugin like any other."""
    import pkgutil

    from . import builtins

    return sorted(
        f"{builtins.__name__}.{m.name}"
        for m in pkgutil.iter_modules(builtins.__path__)
        if not m.name.startswith("_")
    )


class Registered:
    """One thing a plugin registered: its kind, name, object and owning plugin.

    A plugin may register a reference, ``"module:attr"``, in place of the object: it is imported
    (and checked against its kind's contract) the first time ``obj`` is read, when a scenario
    uses it. Every ``reef`` command discovers every plugin, so a recipe whose module imports
    torch registers a reference and costs nothing until it is chosen.
    """

    def __init__(self, kind: str, name: str, obj: Any, plugin: str):
        self.kind = kind
        self.name = name
        self.plugin = plugin
        self._obj = obj

    @property
    def loaded(self) -> bool:
        """Whether the object has been imported (always, unless registered by reference)."""
        return not isinstance(self._obj, str)

    @property
    def obj(self) -> Any:
        if isinstance(self._obj, str):
            self._obj = _resolve(self.kind, self.name, self._obj, self.plugin)
        return self._obj

    def __repr__(self) -> str:
        return f"Registered({self.kind!r}, {self.name!r}, {self._obj!r}, {self.plugin!r})"


def _resolve(kind: str, name: str, ref: str, plugin: str) -> Any:
    """The object ``ref`` (``module:attr``) names, checked as ``register`` checks an object."""
    module, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # an import-time failure is the plugin's, reported by name
        raise PluginError(f"plugin {plugin!r}: {kind} {name!r} ({ref}) failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc
    missing = missing_members(kind, obj, attributes=not isinstance(obj, type))
    if missing:
        raise PluginError(f"plugin {plugin!r} registered {kind} {name!r} without "
                          f"required member(s): {', '.join(missing)}")
    return obj


@dataclass
class Plugins:
    """The loaded plugin manager plus everything the plugins registered, by kind."""

    pm: pluggy.PluginManager
    registry: dict[str, dict[str, Registered]] = field(default_factory=dict)
    config_dirs: list[tuple[str, Path]] = field(default_factory=list)
    #: the version of each entry-point plugin's distribution
    versions: dict[str, str] = field(default_factory=dict)

    def get(self, kind: str, name: str) -> Any:
        """The object registered as ``name`` for ``kind``, or a ConfigError listing choices."""
        from .errors import ConfigError

        try:
            return self.registry[kind][name].obj
        except KeyError:
            choices = ", ".join(sorted(self.registry.get(kind, {}))) or "none"
            raise ConfigError(
                f"unknown {kind.replace('_', ' ')} {name!r}; installed: {choices}"
            ) from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.registry.get(kind, {}))

    @property
    def hook(self):
        return self.pm.hook

    def describe(self) -> list[dict[str, Any]]:
        """What each loaded plugin is and registered, for ``reef plugins``."""
        out = []
        for name, module in sorted(self.pm.list_name_plugin(), key=lambda p: p[0]):
            item: dict[str, Any] = {
                "name": name,
                "module": getattr(module, "__name__", repr(module)),
                "builtin": name.startswith("reef_core."),
                "hooks": sorted(h.name for h in self.pm.get_hookcallers(module) or []),
            }
            if name in self.versions:
                item["version"] = self.versions[name]
            regs: dict[str, list[str]] = {}
            for kind, entries in self.registry.items():
                mine = sorted(n for n, r in entries.items() if r.plugin == name)
                if mine:
                    regs[kind] = mine
            item["registered"] = regs
            out.append(item)
        commands = self.commands()
        for item in out:
            mine = sorted(n for n, plugin in commands.items() if plugin == item["name"])
            if mine:
                item["registered"]["command"] = mine
        return out

    def commands(self) -> dict[str, str]:
        """The commands plugins add to ``reef``, ``{name: plugin}`` (added to a group of their own)."""
        import click

        return add_commands(self, click.Group("reef"))


def _allowed_plugins(env: dict[str, str]) -> set[str] | None:
    raw = env.get("REEF_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def load_plugins(env: dict[str, str] | None = None) -> Plugins:
    """Build a plugin manager with the built-ins and the allowed third-party plugins."""
    env = dict(os.environ if env is None else env)
    pm = pluggy.PluginManager("reef")
    pm.add_hookspecs(hookspecs)
    for modname in builtin_modules():
        pm.register(importlib.import_module(modname), name=modname)

    allowed = _allowed_plugins(env)
    seen: set[str] = set()
    versions: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group="reef"):
        if ep.name in seen or (allowed is not None and ep.name not in allowed):
            continue
        seen.add(ep.name)
        if ep.dist is not None:
            versions[ep.name] = ep.dist.version
        try:
            module = ep.load()
        except Exception as exc:  # any import-time failure is the plugin's, reported by name
            raise PluginError(
                f"plugin {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            pm.register(module, name=ep.name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"plugin {ep.name!r} could not be registered: {exc}") from exc
    if allowed:
        unknown = sorted(allowed - seen)
        if unknown:
            raise PluginError(
                f"REEF_PLUGINS names plugin(s) that are not installed: {', '.join(unknown)}"
            )
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin {name!r} implements a hook Reef does not define: {exc}") from exc

    plugins = Plugins(pm=pm, versions=versions)
    for kind in KINDS:
        plugins.registry[kind] = _collect(pm, kind)
    plugins.config_dirs = _collect_config_dirs(pm)
    return plugins


def _plugin_name(pm: pluggy.PluginManager, impl) -> str:
    return pm.get_name(impl.plugin) or impl.plugin_name


def _collect(pm: pluggy.PluginManager, kind: str) -> dict[str, Registered]:
    hook = getattr(pm.hook, HOOK_FOR_KIND[kind])
    found: dict[str, Registered] = {}
    for impl in hook.get_hookimpls():
        plugin = _plugin_name(pm, impl)

        def register(name: str, obj: Any, *, _plugin: str = plugin) -> None:
            if not isinstance(name, str) or not name:
                raise PluginError(f"plugin {_plugin!r} registered a {kind} with no name")
            if name in found:
                raise PluginError(
                    f"plugin {_plugin!r} registered {kind} {name!r}, "
                    f"which plugin {found[name].plugin!r} already registered"
                )
            if isinstance(obj, str):  # a reference: imported and checked when first used
                module, _, attr = obj.partition(":")
                if not module or not attr:
                    raise PluginError(f"plugin {_plugin!r} registered {kind} {name!r} as {obj!r}; "
                                      "a reference is 'module:attr'")
            else:
                missing = missing_members(kind, obj, attributes=not isinstance(obj, type))
                if missing:
                    raise PluginError(
                        f"plugin {_plugin!r} registered {kind} {name!r} without "
                        f"required member(s): {', '.join(missing)}"
                    )
            found[name] = Registered(kind, name, obj, _plugin)

        try:
            impl.function(register=register)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin!r} failed in {HOOK_FOR_KIND[kind]}: {type(exc).__name__}: {exc}"
            ) from exc
    return found


def add_commands(plugins: Plugins, cli: Any) -> dict[str, str]:
    """Let each plugin add its commands to the click group ``cli`` (``register_commands``), one
    plugin at a time; the names each added, ``{command: plugin}``. A name the group already has
    (Reef's own command or another plugin's) is kept and the plugin refused, with one line
    naming both; a hook that fails is a PluginError naming its plugin."""
    added: dict[str, str] = {}
    for impl in plugins.pm.hook.register_commands.get_hookimpls():
        plugin = _plugin_name(plugins.pm, impl)
        before = dict(cli.commands)
        try:
            impl.function(cli=cli)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {plugin!r} failed in register_commands: {type(exc).__name__}: {exc}") from exc
        for name, command in list(cli.commands.items()):
            if name not in before:
                added[name] = plugin
            elif command is not before[name]:
                cli.commands[name] = before[name]
                owner = f"plugin {added[name]!r}" if name in added else "reef"
                raise PluginError(f"plugin {plugin!r} adds the command {name!r}, which {owner} already has")
    return added


def _collect_config_dirs(pm: pluggy.PluginManager) -> list[tuple[str, Path]]:
    dirs = []
    for impl in pm.hook.reef_config_dir.get_hookimpls():
        plugin = _plugin_name(pm, impl)
        value = impl.function()
        if value is None:
            continue
        path = _resolve_config_dir(str(value), plugin)
        dirs.append((plugin, path))
    return dirs


def _resolve_config_dir(value: str, plugin: str) -> Path:
    if value.startswith("pkg://"):
        import importlib.resources

        module = value[len("pkg://"):].replace("/", ".")
        try:
            path = Path(str(importlib.resources.files(module)))
        except ModuleNotFoundError as exc:
            raise PluginError(f"plugin {plugin!r} names config package {module!r}: {exc}") from exc
    else:
        path = Path(value)
    if not path.is_dir():
        raise PluginError(f"plugin {plugin!r} names config directory {str(path)!r}, which does not exist")
    return path.resolve()


_cached: Plugins | None = None


def get_plugins() -> Plugins:
    """The process's plugins, loaded once on first use (no import-time side effects)."""
    global _cached
    if _cached is None:
        _cached = load_plugins()
    return _cached


def reset_plugins() -> None:
    """Forget the cached plugins (tests, or after installing a plugin)."""
    global _cached
    _cached = None


def check_options(kind: str, name: str, options: dict[str, Any], plugins: Plugins,
                  prefix: str | None = None, services: tuple[str, ...] = ()) -> inspect.Signature | None:
    """Check ``options`` against the constructor of the registered ``kind`` ``name``.

    The constructor's signature is the schema: an option it does not take, a required
    parameter that is missing, or a value that does not fit the parameter's annotation
    (:mod:`reef_core.option_types`) is a ConfigError naming the key; so is any problem the
    class's own ``option_problems`` finds in the values (``reef_core.contracts.option_problems``).
    """
    from .contracts import option_problems
    from .errors import ConfigError
    from .option_types import option_annotations, option_type_problem, shown_value

    prefix = prefix or kind
    cls = plugins.get(kind, name)
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return None
    params = sig.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in options:
        if key not in params and not takes_any:
            raise ConfigError(f"unknown config key {prefix}.{key} ({kind.replace('_', ' ')} {name!r} does not take it)")
    for p in params.values():
        if (p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name not in options and p.name not in services and p.name not in SERVICE_NAMES):
            raise ConfigError(f"missing config key {prefix}.{p.name} for {kind.replace('_', ' ')} {name!r}")
    annotations = option_annotations(cls)
    for key, value in options.items():
        if key in annotations:
            problem = option_type_problem(annotations[key], value, params[key].default)
            if problem:
                raise ConfigError(f"invalid config key {prefix}.{key}: {problem}, got {shown_value(key, value)} "
                                  f"({kind.replace('_', ' ')} {name!r})")
    # the values' own problems (ranges, combinations), as the constructor would find them
    filled = {p.name: p.default for p in params.values()
              if p.default is not inspect.Parameter.empty and p.name not in SERVICE_NAMES}
    problems = option_problems(cls, {**filled, **options})
    if problems:
        raise ConfigError(f"invalid options in {prefix} for {kind.replace('_', ' ')} {name!r}: {'; '.join(problems)}")
    return sig


#: keyword arguments the kernel can supply to a plugin constructor that declares them
SERVICE_NAMES = ("state_dir", "store", "plugins", "settings")


def instantiate(kind: str, name: str, options: dict[str, Any], plugins: Plugins, *, prefix: str | None = None,
                **services: Any) -> Any:
    """Build the registered ``kind`` ``name`` as ``cls(**options)``.

    ``services`` (``state_dir``, ``store``, ...) are passed only when the constructor declares
    a parameter of that name. ``prefix`` is where the options sit in the config (``recipe``,
    ``scenarios.support.recipe_options``; default: ``kind``): every error names it.
    """
    from .errors import ConfigError, PluginError

    prefix = prefix or kind
    services = {"plugins": plugins, **services}  # the plugin set itself is a service too
    sig = check_options(kind, name, options, plugins, prefix=prefix, services=tuple(services))
    kwargs = dict(options)
    if sig is not None:
        for key, value in services.items():
            if key in sig.parameters:
                kwargs[key] = value
    cls = plugins.get(kind, name)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"invalid options in {prefix} for {kind.replace('_', ' ')} {name!r}: {reason}") from exc
    missing = missing_members(kind, obj)
    if missing:
        owner = plugins.registry[kind][name].plugin
        raise PluginError(
            f"plugin {owner!r}: {kind} {name!r} has no {', '.join(missing)} after construction"
        )
    return conform(kind, obj)  # the contract's optional members, resolved once here
