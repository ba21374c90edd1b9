"""What a stored batch config's plugin kinds resolve to here, for `status` and `report`.

Apart from flows/config.py (pydantic models, YAML, the scheduling defaults): `status` shows this line
and needs none of those. `status` asks only whether each kind's module is installed
(`installed_target`: neither the module, which may pull in NumPy and PyArrow, nor pydantic is
imported); `report` resolves the kinds fully, as `resume` would.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentbatch.protocols.plugin_names import PluginError, PluginKind, target_of

if TYPE_CHECKING:
    from agentbatch.protocols.plugins import Plugin


def installed_target(what: PluginKind, kind: str, builtins: Mapping[str, str]) -> str:
    """The "module:Object" a kind names, its module found on the path but not imported. PluginError for
    an unknown name or a module that is not installed; a module that fails on import, or lacks the
    object, is only found by importing it (`protocols.plugins.resolve`)."""
    target = target_of(what, kind, builtins)
    module = target.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or an empty or relative name
        found = False
    if not found:
        raise PluginError(f"{target!r}: no module {module!r} installed")
    return target


def plugins_line(stored: Mapping[str, Any], *, import_targets: bool = True) -> str:
    """What a stored config's kinds resolve to here; never raises: a kind that no longer resolves (its
    package uninstalled) is shown as such — `resume` would refuse it. `import_targets=False`: only
    whether each kind's module is installed (`installed_target`)."""
    from agentbatch.engines.registry import ENGINES, engine_plugin
    from agentbatch.environments.registry import WORKLOADS, workload_plugin

    parts = []
    kinds: tuple[tuple[PluginKind, Mapping[str, str], Callable[[str], Plugin]], ...] = (
        ("workload", WORKLOADS, workload_plugin), ("engine", ENGINES, engine_plugin))
    for what, builtins, load in kinds:
        kind = (stored.get(what) or {}).get("kind") if isinstance(stored.get(what), Mapping) else None
        if not isinstance(kind, str):
            continue
        try:
            target = load(kind).target if import_targets else installed_target(what, kind, builtins)
        except PluginError as exc:
            target = f"NOT RESOLVABLE here ({exc})"
        parts.append(f"{what} {kind}" + ("" if target == kind else f" -> {target}"))
    return "  plugins       " + "; ".join(parts)
