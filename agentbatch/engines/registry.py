"""Engines by kind: a batch config's `engine.kind` picks a factory that builds the workers.

A factory is called as `factory(params: dict, workload: EnvironmentFactory) -> list[Engine]`
(one Engine per worker; `Engine.name` is the worker name recorded in the store), with `params`
checked against its `Params` model first. A kind is a registered name (an entry point of the group
`agentbatch.engines`; the built-in ones are registered in agentbatch's own `pyproject.toml`) or
`"package.module:Object"`; see `agentbatch.protocols.plugins` and docs/plugins.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentbatch.protocols.engine import Engine

if TYPE_CHECKING:
    from agentbatch.protocols.plugins import Plugin

# The built-in kinds, also declared as entry points in pyproject.toml (for an uninstalled tree).
ENGINES: dict[str, str] = {
    "scripted": "agentbatch.engines.scripted:build_scripted_workers",
    "openai": "agentbatch.engines.builtin:build_openai",
    "replay": "agentbatch.engines.replay:build_replay_workers",
}


def engine_plugin(kind: str) -> Plugin:
    """The engine plugin a kind names (raises PluginError, a ValueError)."""
    from agentbatch.protocols.plugins import resolve  # pydantic: not for `status`, which reads only ENGINES

    return resolve("engine", kind, ENGINES)


def make_engines(kind: str, params: dict[str, Any], workload: Any) -> list[Engine]:
    plugin = engine_plugin(kind)
    engines = list(plugin.obj(plugin.validate(params), workload))
    if not engines:
        raise ValueError(f"engine {kind!r} built no workers")
    return engines
