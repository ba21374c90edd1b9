"""Tool calls to a streamable-HTTP upstream as plain JSON-RPC POSTs from the gateway's own loop.

An upstream that negotiated the stateless protocol (2026-07-28: no session, every request stands
alone) takes a `tools/call` as one POST with the headers and `_meta` envelope the `mcp` client
sends. Sending it straight from the gateway's event loop skips the client SDK's thread hop, its
anyio streams and its message models; it goes over the gateway's own keep-alive HTTP/1.1
connections (`http1.py`: about a third of the CPU per call of an aiohttp session, 225 -> 66 us). The SDK connection (`McpConnection`) still
connects, lists the tools and serves every other upstream and every tool the direct path does not
cover (one with an output schema, which the SDK validates). Outcomes map as `McpConnection.call`
maps them: a JSON-RPC error is a tool error result, a request that could not be sent (no
connection) is `EnvironmentUnreachable`, a broken or late answer `EnvironmentFailure`.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from urllib.parse import urlsplit

import httptools
import mcp_types as types
from mcp.shared.inbound import encode_header_value

from agentbatch.environments.mcp_client import McpConnection
from agentbatch.gateway import http1, jsonio
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable

STATELESS_VERSION = "2026-07-28"
_NAMES_MAX = 1024  # tools whose request head is kept


class DirectCaller:
    """`tools/call` of one upstream's tools, straight over HTTP (`covers(name)` says which)."""

    def __init__(self, conn: McpConnection) -> None:
        self.conn = conn
        client = conn.client
        self.version: str = client.protocol_version
        self._param_headers = client.session._resolve_param_headers  # the tool schemas' Mcp-Param-* rule
        self.direct = {t.name for t in conn.tools if t.output_schema is None}
        self._ids = itertools.count(1)
        self._envelope = {types.PROTOCOL_VERSION_META_KEY: self.version,
                          types.CLIENT_INFO_META_KEY: {"name": "mcp", "version": "0.1.0"},
                          types.CLIENT_CAPABILITIES_META_KEY: {}}
        self.pool = self._aim()

    def _aim(self) -> http1.Pool:
        """The connections to the upstream's URL, and the request head for it (again when the URL changes)."""
        self._url = self.conn.spec.url or ""
        self._names: dict[str, bytes] = {}  # tool -> the request head up to its Mcp-Name header
        pool = http1.Pool(self._url)
        self._head = pool.head({"accept": "application/json, text/event-stream", "content-type": "application/json",
                                "mcp-protocol-version": self.version, "mcp-method": "tools/call"})
        return pool

    @classmethod
    def of(cls, conn: McpConnection) -> DirectCaller | None:
        """A direct caller for `conn`'s upstream, or None where the SDK must carry the calls."""
        client = conn.client
        if not conn.spec.url or client is None or not conn.alive:
            return None
        url = urlsplit(conn.spec.url)
        if url.scheme not in ("http", "https") or url.username is not None or url.password is not None:
            return None
        try:
            if client.protocol_version != STATELESS_VERSION:
                return None
            return cls(conn)
        except (AttributeError, RuntimeError):  # an SDK without the parts used here
            return None

    def close(self) -> None:
        """Close the idle connections (those in use close when their call ends)."""
        self.pool.close()

    def covers(self, name: str) -> bool:
        return name in self.direct

    async def call(self, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
                   ) -> types.CallToolResult:
        spec = self.conn.spec
        if spec.url != self._url:
            self.close()
            self.pool = self._aim()
        request_id = next(self._ids)
        body = jsonio.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
            "_meta": {**(meta or {}), **self._envelope}, "name": name, "arguments": arguments}})
        head = self._names.get(name) or self._name_head(name)
        params = "".join(f"{k}: {v}\r\n" for k, v in self._param_headers(name, arguments).items())
        request = b"%s%scontent-length: %d\r\n\r\n%s" % (head, params.encode(), len(body), body)
        pool = self.pool
        connection: http1.Connection | None = None
        try:
            async with asyncio.timeout(self.conn.call_timeout_s):
                try:
                    connection = await pool.connection()
                except OSError as exc:  # nothing was sent
                    raise EnvironmentUnreachable(f"MCP server {spec.name!r} is not running: {exc}") from exc
                await connection.send(request)
                raw = await connection.read()
                status, kind = connection.status, connection.content_type
        except TimeoutError as exc:
            raise EnvironmentFailure(f"MCP {spec.name}.{name}: no answer in {self.conn.call_timeout_s:g} s") from exc
        except (ConnectionError, httptools.HttpParserError) as exc:
            raise EnvironmentFailure(f"MCP server {spec.name!r} died during {name}: {exc!r}") from exc
        finally:
            if connection is not None:
                pool.release(connection)  # kept when its answer was read whole
        return self._result(name, status, kind, raw, request_id)

    def _name_head(self, name: str) -> bytes:
        """The request head up to the tool's name (made once per tool)."""
        if len(self._names) >= _NAMES_MAX:
            self._names.clear()
        head = self._names[name] = self._head + f"mcp-name: {encode_header_value(name)}\r\n".encode()
        return head

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
