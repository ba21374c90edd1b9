"""The MCP tool gateway: an MCP server (streamable HTTP at `/mcp`) that proxies upstream MCP servers.

It lists the upstream servers' tools (a name offered by two servers gets the server's name as a
prefix, `server__tool`; `agentbatch_*` harness tools stay hidden, as in the mcp workload). A tool
call of a sample is admitted like any step of that sample, waits for an environment slot (the
queue ordered by the configured policy, CAAS by default, with the progress the sample made on
both gateways), goes to its upstream, and is recorded as an environment step. Tool errors the
upstream reports are passed back as they are. A call is tried again (after the dead upstream is
started again) only when it cannot have reached the tool, or the tool consents (`protocols/retry.py`):
a call that may have run is never repeated blindly. An upstream that fails or does not answer gives an
isError result and a failed step per attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbatch.db.step_records import StepOutcome, environment_request, environment_response
from agentbatch.environments.mcp_client import McpConnection, McpServerSpec, result_text
from agentbatch.environments.mcp_env import (
    HIDDEN_PREFIX,
    IDEMPOTENCY_KEY,
    Toolset,
    open_toolset,
    reconnect_dead,
)
from agentbatch.gateway import http1, jsonio
from agentbatch.gateway.cluster import ROUTED_HEADER
from agentbatch.gateway.guard import request_body
from agentbatch.gateway.identity import MCP_META_KEY, SampleIdError, tool_sample_key
from agentbatch.gateway.mcp_direct import DirectCaller
from agentbatch.gateway.mcp_endpoint import McpEndpoint
from agentbatch.gateway.state import GatewayState, acquire_step, release_step
from agentbatch.protocols.retry import Call, Effects, StepFailed
from agentbatch.scheduling.types import StepKind

TOOL_CALL_PATH = "/v1/internal/tool-call"  # a tool call forwarded to the process owning its sample

def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class ToolGateway:
    def __init__(self, specs: Sequence[McpServerSpec], state: GatewayState, *, per_sample: Iterable[str] = ()) -> None:
        self.specs = list(specs)
        self.state = state
        self.toolset: Toolset | None = None
        self.tools: list[types.Tool] = []
        self.schemas: dict[str, Any] = {}  # exposed name -> input schema
        self._reconnecting = asyncio.Lock()
        self.sessions = SampleSessions(set(per_sample), state.settings.call_timeout_s)
        state.registry.on_end.append(lambda sample: self.sessions.end(sample.key))
        # With several processes: the owner's internal URL of a sample (None: this one), and the
        # connections to each owner.
        self.owner_url: Callable[[str], str | None] | None = None
        self._owners: dict[str, tuple[http1.Pool, bytes]] = {}
        # Shared connections whose calls go straight over HTTP (`mcp_direct.py`).
        self.direct: dict[McpConnection, DirectCaller] = {}
        self.endpoint: McpEndpoint | None = None  # `/mcp` (once the routes are made)
        self.forwarded: _ForwardedCalls | None = None  # the internal route (once made)

    async def start(self) -> None:
        if not self.specs:
            return
        self.toolset = await open_toolset(self.specs, self.state.settings.call_timeout_s)
        by_upstream = {(conn.spec.name, tool.name): tool for conn in self.toolset.connections for tool in conn.tools}
        self.tools = [
            by_upstream[(conn.spec.name, name)].model_copy(update={"name": exposed})
            for exposed, (conn, name) in self.toolset.route.items() if not name.startswith(HIDDEN_PREFIX)
        ]
        self.schemas = {t.name: t.input_schema for t in self.tools}
        self._direct_callers()

    def _direct_callers(self) -> None:
        """Direct callers for the shared HTTP connections that allow them (after every (re)connect)."""
        if self.toolset is None:
            return
        callers = {conn: self.direct.get(conn) or DirectCaller.of(conn) for conn in self.toolset.connections
                   if conn.spec.name not in self.sessions.upstreams}
        for conn, caller in self.direct.items():  # those of the connections that died
            if conn not in callers:
                caller.close()
        self.direct = {conn: caller for conn, caller in callers.items() if caller is not None}

    async def aclose(self) -> None:
        await self.sessions.aclose()
        for pool, _ in self._owners.values():
            pool.close()
        for caller in self.direct.values():
            caller.close()
        if self.toolset is not None:
            for conn in self.toolset.connections:
                await conn.close()

    def server(self) -> Server:
        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=self.tools)

        async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.answer(getattr(getattr(ctx, "request", None), "headers", None), params)

        return Server("agentbatch-tool-gateway", on_list_tools=on_list_tools, on_call_tool=on_call_tool,
                      get_tool_input_schema=self.input_schema)

    def input_schema(self, name: str) -> Any:
        """The exposed tool's input schema (None: no such tool). The transport checks Mcp-Param headers
        against it: from here, not by dispatching a whole tools/list per call."""
        return self.schemas.get(name)

    def mcp_routes(self, sdk: Starlette, server: Server) -> list[Route]:
        """The SDK app's routes, with `/mcp` answering tool calls itself (`mcp_endpoint.py`)."""
        routes = [r for r in sdk.routes if isinstance(r, Route)]
        (mcp,) = [r for r in routes if r.path == "/mcp"]
        self.endpoint = McpEndpoint(mcp.endpoint, server, self.answer, self.input_schema)
        return [Route(r.path, self.endpoint, methods=r.methods) if r is mcp else r for r in routes]

    async def answer(self, headers: Mapping[str, str] | None, params: types.CallToolRequestParams
                     ) -> types.CallToolResult:
        """A `tools/call` as the MCP server gets it: its sample (headers, `_meta`), then the call."""
        try:
            key = tool_sample_key(headers, params.meta)
        except SampleIdError as exc:  # refused before anything is written
            return _error_result(str(exc))
        return await self.call(key, params.name, dict(params.arguments or {}))

    async def call(self, key: str, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tool call of sample `key`: on the process that owns the sample (`gateway/routing.py`)."""
        if self.owner_url is not None and (url := self.owner_url(key)) is not None:
            return await self._call_at(url, key, name, arguments)
        return await self.call_here(key, name, arguments)

    async def _call_at(self, url: str, key: str, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """The call, run by the process at `url` (its internal tool-call route), over a kept-alive
        connection of this process (`http1.py`)."""
        pool, head = self._owners.get(url) or self._owner(url)
        body = jsonio.dumps({"sample": key, "name": name, "arguments": arguments})
        connection: http1.Connection | None = None
        try:
            connection = await pool.post(head, body)
            raw = await connection.read()
            if connection.status != 200:
                raise ValueError(f"HTTP {connection.status}: {raw[:300]!r}")
            return types.CallToolResult.model_validate(jsonio.loads(raw))
        except (*http1.ERRORS, ValueError) as exc:
            return _error_result(f"tool {name!r}: the gateway process owning sample {key!r} is unreachable: {exc!r}")
        finally:
            if connection is not None:
                pool.release(connection)  # kept when its answer was read whole

    def _owner(self, url: str) -> tuple[http1.Pool, bytes]:
        """The connections to the process at `url`, and the head of a forwarded call to it."""
        pool = http1.Pool(url + TOOL_CALL_PATH)
        head = pool.head({"content-type": "application/json", ROUTED_HEADER: "1"})
        self._owners[url] = (pool, head)
        return pool, head

    async def call_here(self, key: str, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tool call of sample `key` on this process, through the environment-slot gate; retried
        only where the retry rule allows a call with outside effects (`_call_of`)."""
        route = self.toolset.route.get(name) if self.toolset else None
        if route is None or route[1].startswith(HIDDEN_PREFIX):
            return _error_result(f"unknown tool {name!r}")
        state = self.state
        sample = await state.registry.enter(key)
        try:
            held = await acquire_step(state, sample, StepKind.ENVIRONMENT)
        except BaseException:
            state.registry.leave(sample)
            raise
        result: types.CallToolResult | None = None

        async def attempt(n: int) -> types.CallToolResult:
            if n > 1:
                await self._reconnect()
            conn, upstream_name = self._route(name)
            record = environment_request(calls=[{"name": name, "server": conn.spec.name, "arguments": arguments}])
            held.begin(state, record)
            try:
                direct = self.direct.get(conn)
                if direct is not None and direct.covers(upstream_name):
                    out = await direct.call(upstream_name, arguments, meta={MCP_META_KEY: key})
                else:
                    conn = await self.sessions.connection(key, conn)
                    out = await conn.call(upstream_name, arguments, meta={MCP_META_KEY: key})
            except BaseException as exc:
                held.fail(state, f"{exc.__class__.__name__}: {exc}")
                raise
            held.complete(state, _outcome(out, held.slot))
            return out

        try:
            result = await state.settings.retry.run(self._call_of(name, arguments), attempt)
        except StepFailed as exc:
            state.counters.tool_failures += 1
            return _error_result(f"tool {name!r} failed: {exc.__cause__ or exc}")
        finally:
            if release_step(state, held, completed=result is not None):  # not when the shutdown cut it off
                state.registry.leave(sample)
                state.counters.tool_calls += 1
        return result

    def internal_route(self) -> Route:
        """`POST /v1/internal/tool-call` {sample, name, arguments}: a call another process forwarded."""
        self.forwarded = _ForwardedCalls(self)
        return Route(TOOL_CALL_PATH, self.forwarded, methods=["POST"])

    def ahead_of(self, app: ASGIApp, others: dict[str, ASGIApp] | None = None) -> ASGIApp:
        """`app` (the gateway's Starlette app, with the routes above) behind a dispatch that hands a tool
        call (POST /mcp, and the internal route when made) straight to its handler: the app's middleware
        and route matching were a tenth of a call's CPU. `others`: more POST paths handled so (the chat
        route: ~30 us of a chat request's ~600). Everything else goes to `app` as before."""
        paths: dict[str, ASGIApp] = dict(others or {})
        if self.endpoint is not None:
            paths["/mcp"] = self.endpoint
        if self.forwarded is not None:
            paths[TOOL_CALL_PATH] = self.forwarded
        return _ToolPaths(app, paths)

    def _call_of(self, name: str, arguments: dict[str, Any]) -> Call:
        """The call as the retry rule sees it: its effects land upstream, so a failure after it was sent
        is retried only when the tool consents. The hook for that consent: a tool that takes an
        idempotency key, called with one (the upstream recognises the repeat)."""
        idempotent = self.toolset is not None and name in self.toolset.idempotent and IDEMPOTENCY_KEY in arguments
        return Call(StepKind.ENVIRONMENT, f"tool call {name!r}", Effects.EXTERNAL, idempotent=idempotent)

    def _route(self, name: str) -> tuple[McpConnection, str]:
        assert self.toolset is not None
        return self.toolset.route[name]

    async def _reconnect(self) -> None:
        """Start again the upstreams that died (calls in flight on the others are kept)."""
        async with self._reconnecting:
            if self.toolset is not None and not all(c.alive for c in self.toolset.connections):
                self.toolset = await reconnect_dead(self.toolset, self.state.settings.call_timeout_s)
                self._direct_callers()


class _ToolPaths:
    """POST to one of `paths` goes to its handler, the rest to `app`."""

    def __init__(self, app: ASGIApp, paths: dict[str, ASGIApp]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (handler := self.paths.get(scope["path"])):
            await handler(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _ForwardedCalls:
    """The internal tool-call route as a plain ASGI app: the body read and parsed here (orjson), the
    result sent as JSON bytes, no request and response objects."""

    def __init__(self, tools: ToolGateway) -> None:
        self.tools = tools

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await request_body(receive)
        if body is None:
            return  # the forwarding process is gone
        data = jsonio.loads(body)
        result = await self.tools.call_here(str(data["sample"]), str(data["name"]), dict(data.get("arguments") or {}))
        reply = jsonio.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(reply)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply})


class SampleSessions:
    """Upstreams that keep state per session (opt-in by name) get one connection per sample: opened
    on the sample's first call to that upstream, closed when the sample ends (a sample that runs
    again after its end gets a fresh one). The others share one connection."""

    def __init__(self, upstreams: set[str], call_timeout_s: float) -> None:
        self.upstreams = upstreams
        self.call_timeout_s = call_timeout_s
        self.open: dict[tuple[str, str], McpConnection] = {}  # (sample, upstream) -> its connection
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def connection(self, key: str, shared: McpConnection) -> McpConnection:
        """The connection sample `key` uses for `shared`'s upstream."""
        if shared.spec.name not in self.upstreams:
            return shared
        slot = (key, shared.spec.name)
        async with self._locks.setdefault(slot, asyncio.Lock()):
            own = self.open.get(slot)
            if own is None or not own.alive:
                own = McpConnection(shared.spec, call_timeout_s=self.call_timeout_s)
                await own.start()
                self.open[slot] = own
        return own

    def end(self, key: str) -> None:
        """The sample ended: close its connections (in the background)."""
        for slot in [s for s in self.open if s[0] == key]:
            self._locks.pop(slot, None)
            task = asyncio.get_running_loop().create_task(self.open.pop(slot).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        for slot in list(self.open):
            await self.open.pop(slot).close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _outcome(result: types.CallToolResult, slot: str) -> StepOutcome:
    text = result_text(result)
    return StepOutcome(
        response=environment_response([{"role": "tool", "content": text}], False, tool_errors=int(bool(result.is_error))),
        tool_calls=1, worker=slot,
    )


def parse_upstream(text: str) -> McpServerSpec:
    """`NAME=URL` (streamable HTTP) or `NAME=COMMAND ARGS...` (stdio), as given on the command line."""
    name, sep, target = text.partition("=")
    if not sep or not name.strip() or not target.strip():
        raise ValueError(f"--mcp {text!r}: expected NAME=URL or NAME=COMMAND [ARGS...]")
    target = target.strip()
    if target.startswith(("http://", "https://")):
        return McpServerSpec(name=name.strip(), url=target)
    import shlex

    command, *args = shlex.split(target)
    return McpServerSpec(name=name.strip(), command=command, args=args)
