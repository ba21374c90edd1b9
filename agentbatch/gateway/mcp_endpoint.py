"""`POST /mcp` tool calls answered straight from the request bytes, beside the `mcp` SDK's transport.

The SDK serves a 2026-07-28 (stateless) request through its per-request machinery: a Starlette
request, an anyio task group with a memory stream and a disconnect watcher, the server's middleware
chain, the JSON-RPC models and a `json.dumps` of the reply: about half the CPU of a proxied tool
call. This endpoint takes the common request, a `tools/call` that every check of the SDK lets
through, and runs the same checks with the SDK's own functions: Content-Type, Host and Origin,
Accept, the JSON-RPC envelope, repeated routing headers, the envelope ladder (protocol version,
`Mcp-Method`, `Mcp-Name`), `Mcp-Param-*` headers against the tool's schema, the params against the
version's schema. The call goes to the same handler (`ToolGateway.answer`) and its result is shaped
as the SDK shapes it (the version's schema, `resultType`, the server-info stamp). The reply is JSON;
a call still running after the SDK's window (15 s) turns the reply into an SSE stream with
keep-alive pings, and a client that disconnects cancels its call, as with the SDK. Any other request
(other methods and protocol versions, sessions, notifications, GET and DELETE, a request that a check
refuses) goes to the SDK's transport, which answers or refuses it as before. The server's middleware
(the SDK's no-op OpenTelemetry span by default) is not run for the calls answered here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.runner import modern_error_data
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundModernRoute,
    classify_inbound_request,
    validate_mcp_param_headers,
    x_mcp_header_map,
)
from mcp_types import CORE_RESULT_TYPES, INTERNAL_ERROR, methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentbatch.gateway import jsonio

log = logging.getLogger(__name__)

METHOD = "tools/call"
PING_INTERVAL_S = 15.0  # the SDK's window before a reply turns into SSE, and its keep-alive interval
WATCH_AFTER_S = 0.05  # a call still running after this is watched for its client's disconnect
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
               (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]
_ROUTING = (MCP_PROTOCOL_VERSION_HEADER, MCP_METHOD_HEADER, MCP_NAME_HEADER)
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_MEMO_MAX = 256  # distinct header values whose verdict is remembered

Answer = Callable[[Mapping[str, str], types.CallToolRequestParams], Awaitable[types.CallToolResult]]


@dataclass(frozen=True)
class _Call:
    id: int | str
    version: str
    params: types.CallToolRequestParams


class McpEndpoint:
    """The ASGI app at `/mcp`: `tools/call` answered here, everything else by `sdk` (the SDK's app for
    `server`, whose session manager holds the transport settings)."""

    def __init__(self, sdk: ASGIApp, server: Server, answer: Answer, schema: Callable[[str], Any]) -> None:
        manager = server.session_manager
        self.sdk = sdk
        self.server = server
        self.answer = answer
        self.schema = schema
        self.max_body_bytes: int = manager.max_request_body_size
        self._security = TransportSecurityMiddleware(manager.security_settings)
        self._stamp = server.server_info_stamp
        # The SDK's JSON-response mode answers without SSE: its calls stay with the SDK.
        self.enabled = not manager.json_response and METHOD not in server.cache_hints
        self._door: dict[tuple[str, str, str, str], bool] = {}  # (content-type, host, origin, accept) -> passes
        self._annotated: dict[str, tuple[Any, bool]] = {}  # tool -> (its schema, has Mcp-Param headers)
        self.served = 0  # calls answered here (the rest went to the SDK)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.enabled or scope["type"] != "http" or scope["method"] != "POST":
            await self.sdk(scope, receive, send)
            return
        headers = _headers(scope["headers"])
        messages, body = await _read_body(receive, self.max_body_bytes)
        if headers is not None and body is not None and (self._door.get(_door_key(headers))
                                                         or await self._door_open(headers)):
            call = self._parse(scope, headers, body)
            if call is not None:
                self.served += 1
                await self._serve(call, headers, receive, send)
                return

        async def replay() -> Message:
            return messages.popleft() if messages else await receive()

        await self.sdk(scope, replay, send)

    # --- the checks ----------------------------------------------------------------------------------------
    async def _door_open(self, headers: dict[str, str]) -> bool:
        """The transport's checks on the head (Content-Type, Host, Origin, Accept), remembered per value."""
        key = _door_key(headers)
        verdict = self._door.get(key)
        if verdict is None:
            raw = [(name.encode("latin-1"), value.encode("latin-1"))
                   for name, value in zip(("content-type", "host", "origin", "accept"), key, strict=True) if value]
            request = Request({"type": "http", "method": "POST", "headers": raw})
            has_json, has_sse = check_accept_headers(request)
            verdict = has_json and has_sse and await self._security.validate_request(request, is_post=True) is None
            if len(self._door) >= _MEMO_MAX:
                self._door.clear()
            self._door[key] = verdict
        return verdict

    def _parse(self, scope: Scope, headers: dict[str, str], body: bytes) -> _Call | None:
        """The call, when the body is a `tools/call` that every check of the SDK passes; else None."""
        try:
            message = jsonio.loads(body)
        except (ValueError, RecursionError):
            return None
        if not (isinstance(message, dict) and message.keys() <= _REQUEST_KEYS and message.get("jsonrpc") == "2.0"
                and message.get("method") == METHOD and type(message.get("id")) in (int, str)
                and isinstance(message.get("params"), dict)):
            return None
        verdict = classify_inbound_request(message, headers=headers)
        if not isinstance(verdict, InboundModernRoute):
            return None
        raw = message["params"]
        try:
            methods.validate_client_request(METHOD, verdict.protocol_version, raw)
            params = types.CallToolRequestParams.model_validate(raw, by_name=False)
        except (ValidationError, KeyError, ValueError):
            return None
        if self._param_headers_refused(scope, params):
            return None
        return _Call(message["id"], verdict.protocol_version, params)

    def _param_headers_refused(self, scope: Scope, params: types.CallToolRequestParams) -> bool:
        """The `Mcp-Param-*` headers disagree with the arguments (only tools that declare such headers)."""
        schema = self.schema(params.name)
        if schema is None:
            return False
        known = self._annotated.get(params.name)
        if known is None or known[0] is not schema:
            known = self._annotated[params.name] = (schema, bool(x_mcp_header_map(schema)))
        if not known[1]:
            return False
        return validate_mcp_param_headers(schema, params.arguments or {}, Headers(scope=scope)) is not None

    # --- the answer ----------------------------------------------------------------------------------------
    async def _serve(self, call: _Call, headers: dict[str, str], receive: Receive, send: Send) -> None:
        """Run the call (cancelled when the client disconnects) and send its reply: JSON, or SSE once
        the call outlives the window."""
        channel = _Channel(receive, send)
        try:
            reply = await self._reply(call, headers)
        except asyncio.CancelledError:
            if channel.gone and channel.task.uncancel() == 0:
                return  # the client left: the call was cut, nobody is there to answer
            raise
        finally:  # no await before the watcher is cancelled: it cannot cancel what follows
            channel.stop_watching()
            await channel.stop_pings()
        await channel.finish(reply)

    async def _reply(self, call: _Call, headers: dict[str, str]) -> dict[str, Any]:
        """The JSON-RPC reply, a result or the error the SDK makes of a failing handler."""
        try:
            result = self._shape(call.version, await self.answer(headers, call.params))
        except Exception as exc:  # as the SDK maps it: MCPError / ValidationError, else an internal error
            error = modern_error_data(exc).model_dump(mode="json", by_alias=True, exclude_none=True)
            return {"jsonrpc": "2.0", "id": call.id, "error": error}
        return {"jsonrpc": "2.0", "id": call.id, "result": result}

    def _shape(self, version: str, result: types.CallToolResult) -> dict[str, Any]:
        """The result as the SDK puts it on the wire: the version's schema (core result types), then on
        2026-era versions `resultType` and the server-info stamp."""
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        kind = dumped.get("resultType")
        if version not in MODERN_PROTOCOL_VERSIONS or not isinstance(kind, str) or kind in CORE_RESULT_TYPES:
            try:
                dumped = methods.serialize_server_result(METHOD, version, dumped)
            except ValidationError:
                log.exception("the tool gateway returned an invalid result")
                raise MCPError(code=INTERNAL_ERROR, message="Handler returned an invalid result") from None
        if version in MODERN_PROTOCOL_VERSIONS:
            if dumped.get("resultType") is None:
                dumped["resultType"] = "complete"
            meta = dumped.get("_meta")
            if meta is None or (isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None):
                dumped["_meta"] = {**(meta or {}), types.SERVER_INFO_META_KEY: self._stamp}
        return dumped


class _Channel:
    """The reply's channel, and the client on it. Once the call outlives `WATCH_AFTER_S` a watcher
    cancels the call when the client disconnects; once it outlives the window (`PING_INTERVAL_S`) the
    reply turns into an SSE stream with keep-alive pings, which never interleave with the final event.
    A call answered sooner (the usual one) costs one timer: no watcher task, no lock."""

    def __init__(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.receive = receive
        self.send = send
        self.gone = False  # the client disconnected (the watcher cancelled the call)
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(WATCH_AFTER_S, self._watch)
        self._watcher: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    def _watch(self) -> None:
        self._watcher = self._loop.create_task(self._wait_gone())
        self._timer = self._loop.call_later(max(0.0, PING_INTERVAL_S - WATCH_AFTER_S), self._open)

    async def _wait_gone(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.task.cancel()

    def _open(self) -> None:
        self._lock = asyncio.Lock()
        self._pinger = self._loop.create_task(self._ping(self._lock))

    async def _ping(self, lock: asyncio.Lock) -> None:
        async with lock:
            await self.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        while True:
            async with lock:
                await self.send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
            await asyncio.sleep(PING_INTERVAL_S)

    def stop_watching(self) -> None:
        self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()

    async def stop_pings(self) -> None:
        """Stop the pings (not in the middle of one)."""
        if self._pinger is not None and self._lock is not None:
            async with self._lock:
                self._pinger.cancel()

    async def finish(self, reply: dict[str, Any]) -> None:
        data = jsonio.dumps(reply)
        if self._pinger is not None:
            await self.send({"type": "http.response.body", "body": b"event: message\r\ndata: " + data + b"\r\n\r\n",
                             "more_body": False})
            return
        error = reply.get("error")
        status = ERROR_CODE_HTTP_STATUS.get(error["code"], 200) if error is not None else 200
        await self.send({"type": "http.response.start", "status": status, "headers": [
            (b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]})
        await self.send({"type": "http.response.body", "body": data})


def _door_key(headers: dict[str, str]) -> tuple[str, str, str, str]:
    return (headers.get("content-type", ""), headers.get("host", ""), headers.get("origin", ""),
            headers.get("accept", ""))


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str] | None:
    """The request's headers (lowercase names, the first of repeated ones), or None when a routing
    header repeats (the SDK refuses that)."""
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in raw}
    if len(headers) == len(raw):  # no name repeats (the usual request)
        return headers
    headers = {}
    for name, value in raw:
        key = name.decode("latin-1")
        if key in headers:
            if key in _ROUTING:
                return None
            continue
        headers[key] = value.decode("latin-1")
    return headers


async def _read_body(receive: Receive, limit: int) -> tuple[deque[Message], bytes | None]:
    """The messages read (to replay them to the SDK) and the whole body (None: over `limit`, or cut)."""
    messages: deque[Message] = deque()
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        body += message.get("body", b"")
        if len(body) > limit:
            return messages, None
        if not message.get("more_body", False):
            return messages, body
