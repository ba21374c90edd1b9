"""Workloads by name: a batch config's `workload.kind` picks an `EnvironmentFactory`.

Entries are "module:callable" paths, imported only when used, so a BFCL batch does not import the
Docker or MCP SDKs. The callable takes the config's `workload.params` as keyword arguments.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from agentbatch.protocols.environment import EnvironmentFactory

WORKLOADS: dict[str, str] = {
    "bfcl": "agentbatch.environments.bfcl:BfclWorkload",
    "bash_tasks": "agentbatch.environments.bash_tasks.workload:BashTasksWorkload",
    "mcp": "agentbatch.environments.mcp_env:McpWorkload",
    "recorded": "agentbatch.environments.recorded:RecordedWorkload",
}


def make_workload(kind: str, params: dict[str, Any], batch_id: int | None = None) -> EnvironmentFactory:
    """Build the workload. Factories that take a `batch_label` (to label and later clean up the
    sandboxes of a batch, also after a crash) get a stable one derived from the batch id."""
    try:
        path = WORKLOADS[kind]
    except KeyError:
        raise ValueError(f"unknown workload kind {kind!r}; expected one of {sorted(WORKLOADS)}") from None
    module, _, attr = path.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    params = dict(params)
    if batch_id is not None and "batch_label" in inspect.signature(factory).parameters:
        params.setdefault("batch_label", f"batch-{batch_id}")
    return factory(**params)
