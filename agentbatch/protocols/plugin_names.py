"""Plugin kinds as names: which "module:Object" a config's `kind` names, from the entry points and
agentbatch's built-in tables, without importing the target or pydantic (`protocols.plugins` imports
and checks it). `status` needs only this.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Literal

PluginKind = Literal["workload", "engine", "policy"]
GROUPS: dict[str, str] = {
    "workload": "agentbatch.workloads",
    "engine": "agentbatch.engines",
    "policy": "agentbatch.policies",
}
MAX_KIND_LENGTH = 200


class PluginError(ValueError):
    """A kind that cannot be resolved: unknown name, failed import, or not the right sort of object."""


def registered(what: PluginKind) -> dict[str, str]:
    """Registered names of a plugin kind and the "module:Object" each points to (entry points)."""
    return dict(_entry_points(GROUPS[what], _path_state()))


def _path_state() -> tuple[tuple[str, int | None], ...]:
    """sys.path with each entry's modification time: installing or removing a distribution changes it."""
    state: list[tuple[str, int | None]] = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


@lru_cache(maxsize=16)
def _entry_points(group: str, path_state: tuple[tuple[str, int | None], ...]) -> tuple[tuple[str, str], ...]:
    # Scanning every installed distribution costs tens of milliseconds, and a batch resolves its plugins
    # a dozen times (config, plan, run, report): scanned once per state of sys.path.
    return tuple((ep.name, ep.value) for ep in entry_points(group=group))


def target_of(what: PluginKind, kind: str, builtins: Mapping[str, str] | None = None) -> str:
    """The "module:Object" a `kind` names (not imported). `builtins`: names known without installed
    metadata (agentbatch's own, for a source tree that was never `pip install`ed); entry points of the
    same name win."""
    if not isinstance(kind, str) or not kind.strip():
        raise PluginError(f"expected a {what} name or 'package.module:Object', got {kind!r}")
    if len(kind) > MAX_KIND_LENGTH:
        raise PluginError(f"{what} kind is {len(kind)} characters long; at most {MAX_KIND_LENGTH}")
    names = {**dict(builtins or {}), **registered(what)}
    if kind in names:
        return names[kind]
    if ":" in kind:
        return kind
    raise PluginError(
        f"unknown {what} {kind!r}; expected a registered name ({', '.join(sorted(names))}), an entry "
        f"point of the group {GROUPS[what]!r}, or 'package.module:Object'"
    )
