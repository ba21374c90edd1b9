"""Tool calls to a streamable-HTTP upstream as plain JSON-RPC POSTs from the gateway's own loop.

An upstream that negotiated the stateless protocol (2026-07-28: no session, every request stands
alone) takes a `tools/call` as one POST with the headers and `_meta` envelope the `mcp` client
sends. Sending it straight from the gateway's event loop skips the client SDK's thread hop, its
anyio streams and its message models; it goes over the caller's own keep-alive HTTP/1.1
connections (one exchange at a time each, the answer parsed by httptools, uvicorn's C parser:
about a third of the CPU per call of an aiohttp session). The SDK connection (`McpConnection`) still
connects, lists the tools and serves every other upstream and every tool the direct path does not
cover (one with an output schema, which the SDK validates). Outcomes map as `McpConnection.call`
maps them: a JSON-RPC error is a tool error result, a request that could not be sent (no
connection) is `EnvironmentUnreachable`, a broken or late answer `EnvironmentFailure`.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import mcp_types as types
from mcp.shared.inbound import encode_header_value

from agentbatch.environments.mcp_client import McpConnection
from agentbatch.gateway import jsonio
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable

STATELESS_VERSION = "2026-07-28"
IDLE_S = 4.0  # an idle connection is dropped before the upstream would close it (uvicorn: 5 s)


class _Exchange(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the upstream: one request at a time, its answer (a
    Content-Length or chunked body) parsed by httptools."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.body = bytearray()
        self.kind = ""
        self.reusable = True
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionResetError("the upstream closed the connection"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.kind = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.reusable = self.reusable and self.parser.should_keep_alive()
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((self.parser.get_status_code(), self.kind, bytes(self.body)))

    def _end(self, exc: BaseException) -> None:
        self.close()
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, request: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) of the answer to `request`."""
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.body, self.kind = bytearray(), ""
        self.transport.write(request)
        return await self.answer


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
        self._idle: list[_Exchange] = []  # the most recently used last
        self._aim()

    def _aim(self) -> None:
        """Address, TLS and request head for the upstream's URL (again when the URL changes)."""
        self.close()
        self._url = self.conn.spec.url or ""
        url = urlsplit(self._url)
        self._address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._head = (f"POST {target} HTTP/1.1\r\nhost: {url.netloc}\r\naccept: application/json, text/event-stream\r\n"
                      f"content-type: application/json\r\nmcp-protocol-version: {self.version}\r\n"
                      "mcp-method: tools/call\r\n")

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
        while self._idle:
            self._idle.pop().close()

    def covers(self, name: str) -> bool:
        return name in self.direct

    async def call(self, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
                   ) -> types.CallToolResult:
        spec = self.conn.spec
        if spec.url != self._url:
            self._aim()
        request_id = next(self._ids)
        body = jsonio.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
            "_meta": {**(meta or {}), **self._envelope}, "name": name, "arguments": arguments}})
        headers = {"mcp-name": encode_header_value(name), **self._param_headers(name, arguments),
                   "content-length": str(len(body))}
        request = (self._head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
        answered = False
        exchange: _Exchange | None = None
        try:
            async with asyncio.timeout(self.conn.call_timeout_s):
                exchange = await self._connection()
                status, kind, raw = await exchange.exchange(request)
                answered = True
        except TimeoutError as exc:
            raise EnvironmentFailure(f"MCP {spec.name}.{name}: no answer in {self.conn.call_timeout_s:g} s") from exc
        except (ConnectionError, httptools.HttpParserError) as exc:
            raise EnvironmentFailure(f"MCP server {spec.name!r} died during {name}: {exc!r}") from exc
        finally:
            if exchange is not None:
                self._release(exchange, answered)
        return self._result(name, status, kind, raw, request_id)

    async def _connection(self) -> _Exchange:
        """An idle connection to the upstream, or a new one (EnvironmentUnreachable: none can be made)."""
        loop = asyncio.get_running_loop()
        while self._idle:
            exchange = self._idle.pop()
            if exchange.reusable and loop.time() - exchange.idle_since < IDLE_S:
                return exchange
            exchange.close()
        host, port = self._address
        try:
            _, exchange = await loop.create_connection(_Exchange, host, port, ssl=self._tls)
        except OSError as exc:  # nothing was sent
            raise EnvironmentUnreachable(f"MCP server {self.conn.spec.name!r} is not running: {exc}") from exc
        return exchange

    def _release(self, exchange: _Exchange, answered: bool) -> None:
        """Back to the idle ones when it answered and may be kept; closed otherwise (cut mid-exchange)."""
        if answered and exchange.reusable:
            exchange.idle_since = asyncio.get_running_loop().time()
            self._idle.append(exchange)
        else:
            exchange.close()

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
