"""The gateway's MCP tool gateway as an inspect MCP server."""

from __future__ import annotations

from typing import Any

from inspect_agentbatch.identity import SAMPLE_HEADER, active_gateway_root, gateway_root, note_started


def gateway_mcp_server(*, name: str = "agentbatch", base_url: str | None = None, timeout: float = 30,
                       sse_read_timeout: float = 300) -> Any:
    """An inspect MCP server for the gateway's `/mcp` (use it where the task uses `mcp_server_http`):
    inspect opens one connection per sample, and each names its sample (`X-Agentbatch-Sample`), so a
    sample's tool calls count with its inference requests (admission, CAAS, priority, records). The
    gateway is `base_url`, else the one the sample's `agentbatch/<model>` talks to."""
    from inspect_ai.tool._mcp._compat import streamablehttp_client
    from inspect_ai.tool._mcp._local import MCPServerLocal

    def connect() -> Any:  # called in the sample's task, when it first uses the server
        root = gateway_root(base_url) if base_url else active_gateway_root()
        key = note_started(root)
        return streamablehttp_client(root + "/mcp", {SAMPLE_HEADER: key} if key else None, timeout, sse_read_timeout)

    return MCPServerLocal(connect, name=name, events=True)
