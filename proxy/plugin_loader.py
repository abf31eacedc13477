"""Build a target's plugin chain from its config.

A chain entry is either a built-in plugin name (``"metrics"`` → module ``plugins.metrics``, its
``Plugin`` class) or an importable path ``"package.module:ClassName"``. A plugin class may have an
``Options`` attrs class: its ``[plugins.<name>]`` table is loaded into it with the same strict
rules as the rest of the config (unknown keys are errors). Without ``Options`` the table must be
empty. The constructor gets the options (if any) and, when it accepts a second argument, a
``PluginContext``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import attrs

from proxy.config import Config, ConfigError, structure_checked
from proxy.hooks import HOOK_NAMES, Hooks

__all__ = ["load_chain", "resolve_plugin", "PluginContext", "instantiate"]


@attrs.frozen
class PluginContext:
    target: str
    config: Config


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
    return cls


def instantiate(cls: type, raw_options: dict[str, Any], context: PluginContext, path: str) -> Any:
    options_cls = getattr(cls, "Options", None)
    args: list[Any] = []
    if options_cls is not None:
        args.append(structure_checked(raw_options, options_cls, root=path))
    elif raw_options:
        raise ConfigError(f"{path}: this plugin takes no options (got {', '.join(sorted(raw_options))})")
    params = [
        p for p in inspect.signature(cls).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) > len(args):
        args.append(context)
    try:
        return cls(*args)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_chain(config: Config) -> Hooks:
    context = PluginContext(config.name, config)
    plugins = []
    seen = set()
    for name in config.plugins.chain:
        if name in seen:
            raise ConfigError(f"$.plugins.chain: {name!r} listed twice")
        seen.add(name)
        cls = resolve_plugin(name)
        plugins.append((name, instantiate(cls, config.plugins.options.get(name, {}), context, f"$.plugins.{name}")))
    return Hooks(plugins)
