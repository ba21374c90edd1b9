"""What a stored batch config's plugin kinds resolve to here, for `status` and `report`.

Apart from flows/config.py (pydantic models, YAML, the scheduling defaults): `status` shows this line
and needs none of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentbatch.protocols.plugins import PluginError


def plugins_line(stored: Mapping[str, Any]) -> str:
    """What a stored config's kinds resolve to here; never raises: a kind that no longer resolves (its
    package uninstalled) is shown as such — `resume` would refuse it."""
    from agentbatch.engines.registry import engine_plugin
    from agentbatch.environments.registry import workload_plugin

    parts = []
    for what, load in (("workload", workload_plugin), ("engine", engine_plugin)):
        kind = (stored.get(what) or {}).get("kind") if isinstance(stored.get(what), Mapping) else None
        if not isinstance(kind, str):
            continue
        try:
            target = load(kind).target
        except PluginError as exc:
            target = f"NOT RESOLVABLE here ({exc})"
        parts.append(f"{what} {kind}" + ("" if target == kind else f" -> {target}"))
    return "  plugins       " + "; ".join(parts)
