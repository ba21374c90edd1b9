"""Shared plumbing of the shipped MCP servers: a low-level `Server` over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

CallFn = Callable[..., Awaitable[types.CallToolResult]]  # (name, arguments[, meta])


def text_result(value: Any, *, is_error: bool = False) -> types.CallToolResult:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def build_server(name: str, tools: list[types.Tool], call: CallFn, *, with_meta: bool = False) -> Server:
    """`with_meta`: `call` also gets the request's `_meta`."""

    async def on_list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if with_meta:
            return await call(params.name, dict(params.arguments or {}), params.meta)
        return await call(params.name, dict(params.arguments or {}))

    return Server(name, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def add_transport_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead of stdio")


def serve(server: Server, http: str | None) -> None:
    if http:
        import uvicorn

        host, _, port = http.rpartition(":")
        uvicorn.run(server.streamable_http_app(), host=host or "127.0.0.1", port=int(port), log_level="warning")
        return

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
