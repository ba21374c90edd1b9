"""Workloads by kind: a batch config's `workload.kind` picks an `EnvironmentFactory`.

A kind is a registered name (an entry point of the group `agentbatch.workloads`; the built-in ones
are registered in agentbatch's own `pyproject.toml`) or `"package.module:Object"`; see
`agentbatch.protocols.plugins` and docs/plugins.md. Targets are imported only when used, so a BFCL
batch does not import the Docker or MCP SDKs. The factory is called with the config's
`workload.params` (checked against its parameter model) as keyword arguments.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from agentbatch.protocols.environment import EnvironmentFactory

if TYPE_CHECKING:
    from agentbatch.protocols.plugins import Plugin

# The built-in kinds, also declared as entry points in pyproject.toml; this table serves a source
# tree whose package metadata was never installed.
WORKLOADS: dict[str, str] = {
    "bfcl": "agentbatch.environments.bfcl:BfclWorkload",
    "bash_tasks": "agentbatch.environments.bash_tasks.workload:BashTasksWorkload",
    "mcp": "agentbatch.environments.mcp_env:McpWorkload",
    "recorded": "agentbatch.environments.recorded:RecordedWorkload",
}


def workload_plugin(kind: str) -> Plugin:
    """The workload plugin a kind names (raises PluginError, a ValueError)."""
    from agentbatch.protocols.plugins import resolve  # pydantic: not for `status`, which reads only WORKLOADS

    return resolve("workload", kind, WORKLOADS)


def make_workload(kind: str, params: dict[str, Any], batch_id: int | None = None) -> EnvironmentFactory:
    """Build the workload. Factories that take a `batch_label` (to label and later clean up the
    sandboxes of a batch, also after a crash) get a stable one derived from the batch id."""
    plugin = workload_plugin(kind)
    kwargs = plugin.validate(params)
    if batch_id is not None and kwargs.get("batch_label") is None and _accepts(plugin.obj, "batch_label"):
        kwargs["batch_label"] = f"batch-{batch_id}"
    return plugin.obj(**kwargs)


def takes_batch_label(kind: str) -> bool:
    """Whether the workload labels its sandboxes by batch (a `batch_label` its parameters may name)."""
    plugin = workload_plugin(kind)
    model = plugin.params_model
    return _accepts(plugin.obj, "batch_label") and (
        "batch_label" in model.model_fields or model.model_config.get("extra") == "allow")


def _accepts(factory: Any, name: str) -> bool:
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
