"""A stateful MCP server written the way a third party would (the SDK's MCPServer, no agentbatch
imports): per-`state_key` key-value stores, a refund tool with an idempotency risk, a state dump."""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer

app = MCPServer("kv-store")
STORES: dict[str, dict[str, str]] = {}


@app.tool()
def kv_set(state_key: str, key: str, value: str) -> str:
    """Save value under key."""
    STORES.setdefault(state_key, {})[key] = value
    return "ok"


@app.tool()
def kv_get(state_key: str, key: str) -> str:
    """The value under key."""
    return STORES.get(state_key, {}).get(key, "missing")


@app.tool()
def debug_dump(state_key: str) -> str:
    """Internal: the whole store (hidden from the model by the workload's tools_hide)."""
    return json.dumps(STORES.get(state_key, {}), sort_keys=True)


if __name__ == "__main__":
    app.run()
