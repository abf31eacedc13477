"""Build a target's plugin chain from its config.

A chain entry is either a built-in plugin name (``"metrics"`` → module ``plugins.metrics``, its
``Plugin`` class) or an importable path ``"package.module:ClassName"``. A plugin class may have an
``Options`` attrs class: its ``[plugins.<name>]`` table is loaded into it with the same strict
rules as the rest of the config (unknown keys are errors, every error names the key's path, e.g.
``$.plugins.firewall.deny[1]``). Without ``Options`` the table must be empty. The constructor
gets the options (if any) and, when it accepts a second argument, a ``PluginContext``.

Option classes can use, besides the config's own types (``proxy.config.Duration``, ``Size``,
``Address``, ``Literal[...]``): ``re.Pattern[str]`` (compiled at load, a bad regex is a config
error) and ``Annotated[T, Check(...)]`` for value constraints (``between``, ``at_least``,
``greater_than``). Lists must be TOML arrays: ``deny = "DROP"`` is an error, not four letters.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import attrs

from proxy.config import Config, ConfigError, structure_checked
from proxy.config import converter as _config_converter
from proxy.hooks import HOOK_NAMES, Hooks

__all__ = [
    "load_chain",
    "check_chain",
    "resolve_plugin",
    "build_plugin",
    "structure_options",
    "PluginContext",
    "instantiate",
    "Check",
    "between",
    "at_least",
    "greater_than",
]


@attrs.frozen
class PluginContext:
    """What a plugin may know about where it runs."""

    target: str
    config: Config
    name: str = ""  # the plugin's name in the chain

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"replay_proxy.plugins.{self.name or 'plugin'}")


# --- Option types -----------------------------------------------------------------------------


@attrs.frozen
class Check:
    """A constraint for ``Annotated[T, Check(ok, "must be ...")]`` option fields."""

    ok: Callable[[Any], bool]
    message: str


def between(low: float, high: float) -> Check:
    return Check(lambda v: low <= v <= high, f"expected a number from {low:g} to {high:g}")


def at_least(low: float) -> Check:
    return Check(lambda v: v >= low, f"expected a number of at least {low:g}")


def greater_than(low: float) -> Check:
    return Check(lambda v: v > low, f"expected a number greater than {low:g}")


def _make_options_converter():
    # A copy: these stricter hooks must not change how the core config is read.
    conv = _config_converter.copy()

    def structure_float(value: Any, _: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)

    def is_pattern(t: Any) -> bool:
        return t is re.Pattern or get_origin(t) is re.Pattern

    def structure_pattern(value: Any, _: Any) -> re.Pattern[str]:
        if not isinstance(value, str):
            raise ValueError(f"expected a regular expression (a string), got {value!r}")
        try:
            return re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from None

    def is_checked(t: Any) -> bool:
        return get_origin(t) is Annotated and any(isinstance(m, Check) for m in t.__metadata__)

    def structure_checked(value: Any, t: Any) -> Any:
        base, *metadata = get_args(t)
        result = conv.structure(value, base)
        for check in metadata:
            if isinstance(check, Check) and not check.ok(result):
                raise ValueError(f"{check.message}, got {value!r}")
        return result

    conv.register_structure_hook(float, structure_float)
    conv.register_structure_hook_func(is_pattern, structure_pattern)
    conv.register_structure_hook_func(is_checked, structure_checked)
    return conv


_options_converter = _make_options_converter()


def structure_options(raw: Any, options_cls: type, path: str) -> Any:
    """Load a ``[plugins.<name>]`` table into ``options_cls``; ConfigError names each bad key."""
    return structure_checked(raw, options_cls, path, _options_converter)


# --- Resolution and construction ----------------------------------------------------------------


def resolve_plugin(name: str) -> type:
    if ":" in name:
        module_name, _, attr = name.partition(":")
    else:
        if not name.isidentifier():
            raise ConfigError(f"$.plugins.chain: {name!r} is neither a built-in plugin name nor 'module:Class'")
        module_name, attr = f"plugins.{name}", "Plugin"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"$.plugins.chain: no plugin {name!r} (module {module_name} not found)") from None
        raise
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ConfigError(f"$.plugins.chain: {module_name} has no plugin class {attr!r}")
    if not any(callable(getattr(cls, hook, None)) for hook in HOOK_NAMES) and not hasattr(cls, "http_routes"):
        raise ConfigError(f"$.plugins.chain: {name!r} implements none of the hooks {', '.join(HOOK_NAMES)}")
    if inspect.iscoroutinefunction(getattr(cls, "is_idempotent", None)):
        raise ConfigError(f"$.plugins.chain: {name!r}: is_idempotent must be a plain method, not async")
    return cls


def instantiate(cls: type, raw_options: dict[str, Any], context: PluginContext, path: str) -> Any:
    options_cls = getattr(cls, "Options", None)
    args: list[Any] = []
    if options_cls is not None:
        args.append(structure_options(raw_options, options_cls, path))
    elif raw_options:
        raise ConfigError(f"{path}: this plugin takes no options (got {', '.join(sorted(raw_options))})")
    params = [p for p in inspect.signature(cls).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) > len(args):
        args.append(context)
    try:
        return cls(*args)
    except (ValueError, TypeError, OSError) as exc:  # e.g. a log file that cannot be opened
        raise ConfigError(f"{path}: {exc}") from None


def build_plugin(name: str, raw_options: dict[str, Any], config: Config) -> Any:
    """One chain entry: resolve ``name``, check its options, construct it."""
    context = PluginContext(config.name, config, name)
    return instantiate(resolve_plugin(name), raw_options, context, f"$.plugins.{name}")


def load_chain(config: Config) -> Hooks:
    plugins = []
    for name in _chain_names(config):
        plugins.append((name, build_plugin(name, config.plugins.options.get(name, {}), config)))
    _check_routes(plugins)
    return Hooks(plugins)


def check_chain(config: Config) -> None:
    """What ``load_chain`` checks without building the plugins (``--check`` has no side
    effects: no file opened, nothing registered): names resolve, options are valid."""
    for name in _chain_names(config):
        cls = resolve_plugin(name)
        options_cls = getattr(cls, "Options", None)
        raw = config.plugins.options.get(name, {})
        if options_cls is not None:
            structure_options(raw, options_cls, f"$.plugins.{name}")
        elif raw:
            raise ConfigError(f"$.plugins.{name}: this plugin takes no options (got {', '.join(sorted(raw))})")


def _chain_names(config: Config) -> list[str]:
    seen: set[str] = set()
    for name in config.plugins.chain:
        if name in seen:
            raise ConfigError(f"$.plugins.chain: {name!r} listed twice")
        seen.add(name)
    return list(config.plugins.chain)


def _check_routes(plugins: list[tuple[str, Any]]) -> None:
    """Two plugins serving the same admin path is a config error, found before anything listens."""
    owners = dict.fromkeys(("/health", "/healthz", "/readyz", "/status"), "the proxy")  # /metrics: merged
    for name, plugin in plugins:
        provider = getattr(plugin, "http_routes", None)
        for path in provider() if provider is not None else ():
            if path in owners:
                raise ConfigError(f"$.plugins.chain: {name!r} serves {path}, which {owners[path]} already serves")
            owners[path] = repr(name)
