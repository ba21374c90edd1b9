"""Tool calls to a streamable-HTTP upstream as plain JSON-RPC POSTs from the gateway's own loop.

An upstream that negotiated the stateless protocol (2026-07-28: no session, every request stands
alone) takes a `tools/call` as one POST with the headers and `_meta` envelope the `mcp` client
sends. Sending it straight from the gateway's event loop, with the gateway's pooled aiohttp
session, skips the client SDK's thread hop, its anyio streams and its message models: the SDK
connection (`McpConnection`) still connects, lists the tools and serves every other upstream and
every tool the direct path does not cover (one with an output schema, which the SDK validates).
Outcomes map as `McpConnection.call` maps them: a JSON-RPC error is a tool error result, a request
that could not be sent is `EnvironmentUnreachable`, a broken or late answer `EnvironmentFailure`.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import mcp_types as types

from agentbatch.environments.mcp_client import McpConnection
from agentbatch.gateway import jsonio
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable

STATELESS_VERSION = "2026-07-28"


class DirectCaller:
    """`tools/call` of one upstream's tools, straight over HTTP (`covers(name)` says which)."""

    def __init__(self, conn: McpConnection, session: aiohttp.ClientSession) -> None:
        self.conn = conn
        self.session = session
        client = conn.client
        self.version: str = client.protocol_version
        self._param_headers = client.session._resolve_param_headers  # the tool schemas' Mcp-Param-* rule
        self.direct = {t.name for t in conn.tools if t.output_schema is None}
        self._ids = itertools.count(1)
        self._envelope = {types.PROTOCOL_VERSION_META_KEY: self.version,
                          types.CLIENT_INFO_META_KEY: {"name": "mcp", "version": "0.1.0"},
                          types.CLIENT_CAPABILITIES_META_KEY: {}}
        self._headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                         "mcp-protocol-version": self.version, "mcp-method": "tools/call"}

    @classmethod
    def of(cls, conn: McpConnection, session: aiohttp.ClientSession) -> DirectCaller | None:
        """A direct caller for `conn`'s upstream, or None where the SDK must carry the calls."""
        client = conn.client
        if not conn.spec.url or client is None or not conn.alive:
            return None
        try:
            if client.protocol_version != STATELESS_VERSION:
                return None
            return cls(conn, session)
        except (AttributeError, RuntimeError):  # an SDK without the parts used here
            return None

    def covers(self, name: str) -> bool:
        return name in self.direct

    async def call(self, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
                   ) -> types.CallToolResult:
        spec = self.conn.spec
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
            "_meta": {**(meta or {}), **self._envelope}, "name": name, "arguments": arguments}}
        headers = {**self._headers, "mcp-name": name, **self._param_headers(name, arguments)}
        assert spec.url is not None
        try:
            async with asyncio.timeout(self.conn.call_timeout_s):
                async with self.session.post(spec.url, data=jsonio.dumps(body), headers=headers) as resp:
                    raw = await resp.read()
                    status, kind = resp.status, resp.headers.get("content-type", "")
        except aiohttp.ClientConnectorError as exc:  # nothing was sent
            raise EnvironmentUnreachable(f"MCP server {spec.name!r} is not running: {exc}") from exc
        except TimeoutError as exc:
            raise EnvironmentFailure(f"MCP {spec.name}.{name}: no answer in {self.conn.call_timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            raise EnvironmentFailure(f"MCP server {spec.name!r} died during {name}: {exc!r}") from exc
        return self._result(name, status, kind, raw, request_id)

    def _result(self, name: str, status: int, kind: str, raw: bytes, request_id: int) -> types.CallToolResult:
        spec = self.conn.spec
        message = _message(raw, kind, request_id)
        if message is None:
            raise EnvironmentFailure(f"MCP {spec.name}.{name} failed: HTTP {status}: {raw[:300]!r}")
        if "error" in message:  # the server answered with a JSON-RPC error: a tool error for the model
            error = message["error"] if isinstance(message["error"], dict) else {}
            return types.CallToolResult(content=[types.TextContent(
                type="text", text=f"MCP error {error.get('code')}: {error.get('message')}")], is_error=True)
        try:
            result = types.CallToolResult.model_validate(message.get("result"))
        except ValueError as exc:
            raise EnvironmentFailure(f"MCP {spec.name}.{name} failed: {exc!r}") from exc
        if result.result_type not in (None, "complete"):  # input required: the gateway does not answer those
            raise EnvironmentFailure(f"MCP {spec.name}.{name} failed: a {result.result_type!r} result")
        return result


def _message(raw: bytes, kind: str, request_id: int) -> dict[str, Any] | None:
    """The JSON-RPC answer to `request_id` in a JSON body or an SSE stream (other events skipped)."""
    if "text/event-stream" in kind:
        found = None
        for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
            data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
            candidate = _parse(data)
            if candidate is not None and candidate.get("id") == request_id:
                found = candidate
        return found
    message = _parse(raw)
    return message if message is not None and message.get("id") == request_id else None


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        value = jsonio.loads(data) if data else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
