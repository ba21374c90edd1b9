"""Workloads by name: a batch config's `workload.kind` picks an `EnvironmentFactory`.

Entries are "module:callable" paths, imported only when used, so a BFCL batch does not import the
Docker or MCP SDKs. The callable takes the config's `workload.params` as keyword arguments.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentbatch.tasks.environments.base import EnvironmentFactory

WORKLOADS: dict[str, str] = {
    "bfcl": "agentbatch.tasks.environments.bfcl:BfclWorkload",
    "bash_tasks": "agentbatch.tasks.environments.bash_tasks.workload:BashTasksWorkload",
    "mcp": "agentbatch.tasks.environments.mcp_env:McpWorkload",
    "recorded": "agentbatch.tasks.environments.recorded:RecordedWorkload",
}


def make_workload(kind: str, params: dict[str, Any]) -> EnvironmentFactory:
    try:
        path = WORKLOADS[kind]
    except KeyError:
        raise ValueError(f"unknown workload kind {kind!r}; expected one of {sorted(WORKLOADS)}") from None
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)(**params)
