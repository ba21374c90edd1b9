"""A connection to one MCP server (stdio subprocess or streamable HTTP), usable from any event loop.

The `mcp` client is built on anyio cancel scopes that must be entered and left in one task; an
agent sample's steps run in different tasks (and a runner may use several loops). So each
connection lives in a thread of its own with its own loop, and callers hand it coroutines through
`run_coroutine_threadsafe`. Calls from many samples share the one session and run concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable


@dataclass(slots=True)
class McpServerSpec:
    """How to reach one MCP server: a command to start over stdio, or a streamable-HTTP URL."""

    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> McpServerSpec:
        spec = cls(**params)
        if bool(spec.command) == bool(spec.url):
            raise ValueError(f"MCP server {spec.name!r}: give exactly one of command (stdio) or url (HTTP)")
        return spec

    def formatted(self, values: dict[str, Any]) -> McpServerSpec:
        """The spec with `{key}` placeholders in args/env filled from a task's data (per-sample servers)."""
        return McpServerSpec(
            name=self.name,
            command=self.command,
            args=[a.format(**values) for a in self.args],
            env={k: v.format(**values) for k, v in (self.env or {}).items()} or None,
            cwd=self.cwd,
            url=self.url.format(**values) if self.url else None,
        )


def result_text(result: types.CallToolResult) -> str:
    parts = []
    for item in result.content:
        parts.append(item.text if isinstance(item, types.TextContent) else f"[{item.type} content]")
    return "\n".join(parts)


class McpConnection:
    def __init__(self, spec: McpServerSpec, *, call_timeout_s: float = 60.0, connect_timeout_s: float = 60.0) -> None:
        self.spec = spec
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.tools: list[types.Tool] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._done: concurrent.futures.Future = concurrent.futures.Future()
        self._broken = False  # the transport closed under us (server died)

    @property
    def client(self) -> Any:
        """The connected `mcp.Client` (None before `start`): for reading what it negotiated."""
        return self._client

    @property
    def alive(self) -> bool:
        return self._ready.done() and not self._done.done() and not self._broken

    async def start(self) -> None:
        """Connect and list the tools; `EnvironmentUnreachable` when the server cannot be reached (no
        call was sent, so one that waits on this connection may be retried)."""
        self._thread = threading.Thread(target=self._run, name=f"mcp-{self.spec.name}", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._ready), self.connect_timeout_s)
        except TimeoutError as exc:
            await self.close()
            raise EnvironmentUnreachable(f"MCP server {self.spec.name!r}: no answer in {self.connect_timeout_s:g} s") from exc
        except EnvironmentFailure:
            await self.close()
            raise

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported through the futures
            if not self._ready.done():
                self._ready.set_exception(EnvironmentUnreachable(f"MCP server {self.spec.name!r}: {exc!r}"))
        finally:
            if not self._done.done():
                self._done.set_result(None)
            loop.close()

    async def _main(self) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        if self.spec.url:
            target: Any = self.spec.url
        else:  # the server's stderr goes to this process's stderr of now (the SDK's default: of import time)
            target = stdio_client(StdioServerParameters(
                command=self.spec.command, args=self.spec.args, env=self.spec.env, cwd=self.spec.cwd
            ), errlog=sys.stderr)
        self._stop = asyncio.Event()
        async with Client(target, read_timeout_seconds=self.call_timeout_s) as client:
            self._client = client
            listed = await client.list_tools()
            tools = list(listed.tools)
            while listed.next_cursor:
                listed = await client.list_tools(cursor=listed.next_cursor)
                tools.extend(listed.tools)
            self.tools = tools
            self._ready.set_result(None)
            await self._stop.wait()

    async def call(self, name: str, arguments: dict[str, Any], *,
                   meta: dict[str, Any] | None = None) -> types.CallToolResult:
        """One tool call (`meta`: the request's `_meta`, e.g. which sample calls). isError results and JSON-RPC errors of a live server come back as results
        (tool errors); a dead server, a broken transport or no answer raise `EnvironmentFailure`
        (`EnvironmentUnreachable` when the call was not sent: the server is not running)."""
        if not self.alive or self._loop is None:
            raise EnvironmentUnreachable(f"MCP server {self.spec.name!r} is not running")
        fut = asyncio.run_coroutine_threadsafe(self._client.call_tool(name, arguments, meta=meta), self._loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.call_timeout_s + 5)
        except TimeoutError as exc:
            fut.cancel()
            raise EnvironmentFailure(f"MCP {self.spec.name}.{name}: no answer in {self.call_timeout_s:g} s") from exc
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):  # the transport is gone or stuck
                self._broken = True
                raise EnvironmentFailure(f"MCP server {self.spec.name!r} during {name}: {exc!r}") from exc
            if self.alive:  # the server answered with a JSON-RPC error: the model sees it as a tool error
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=f"MCP error {exc.code}: {exc}")], is_error=True
                )
            raise EnvironmentFailure(f"MCP server {self.spec.name!r} died during {name}: {exc!r}") from exc
        except Exception as exc:  # noqa: BLE001 - closed streams, a dead process
            if not self.alive:
                raise EnvironmentFailure(f"MCP server {self.spec.name!r} died during {name}: {exc!r}") from exc
            raise EnvironmentFailure(f"MCP {self.spec.name}.{name} failed: {exc!r}") from exc

    async def close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        if self._thread is not None:
            await asyncio.wrap_future(self._done)
            self._thread.join(timeout=10)
