"""Engines by name: a batch config's `engine.kind` picks a factory that builds the workers.

A factory is called as `factory(params: dict, workload: EnvironmentFactory) -> list[Engine]`
(one Engine per worker; `Engine.name` is the worker name recorded in the store). Entries are
"module:callable" paths imported on use.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentbatch.protocols.engine import Engine

ENGINES: dict[str, str] = {
    "scripted": "agentbatch.engines.scripted:build_scripted_workers",
    "openai": "agentbatch.engines.openai_http:build_openai_workers",
    "replay": "agentbatch.engines.replay:build_replay_workers",
}


def make_engines(kind: str, params: dict[str, Any], workload: Any) -> list[Engine]:
    try:
        path = ENGINES[kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; expected one of {sorted(ENGINES)}") from None
    module, _, attr = path.partition(":")
    return list(getattr(importlib.import_module(module), attr)(params, workload))
