"""A tiny MCP server for tests and benchmarks: echo, a slow tool that reports when it ran, a failing tool.

`sleep` records its start and end (time.time()) and the server's pid, so a test can check that calls
sent at once really overlapped; `fail` returns an isError result; `crash` raises inside the handler;
`session` reports the server's pid, how many times it was called in this process and the sample
the call's `_meta` names (a stateful per-session environment in miniature).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import mcp_types as types

from agentbatch.environments.mcp_servers._serve import (
    add_transport_args,
    build_server,
    serve,
    text_result,
)


def _tool(name: str, description: str, props: dict[str, Any], required: list[str]) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema={"type": "object", "properties": props, "required": required},
    )


TOOLS = [
    _tool("echo", "Return the given text.", {"text": {"type": "string"}}, ["text"]),
    _tool(
        "sleep",
        "Wait the given seconds; returns start/end times.",
        {"seconds": {"type": "number"}, "tag": {"type": "string"}},
        ["seconds"],
    ),
    _tool("fail", "Always fails with the given message.", {"message": {"type": "string"}}, []),
    _tool("crash", "Raises inside the server.", {}, []),
    _tool("session", "This server process: pid, calls so far, the sample in the call's _meta.", {}, []),
]
_session = {"calls": 0}  # this process's state


def _meta_sample(meta: Any) -> Any:
    if meta is None:
        return None
    get = meta.get if isinstance(meta, dict) else (lambda k: (meta.model_extra or {}).get(k))
    return get("agentbatch/sample")


async def call(name: str, args: dict[str, Any], meta: Any = None) -> types.CallToolResult:
    if name == "session":
        _session["calls"] += 1
        return text_result({"pid": os.getpid(), "calls": _session["calls"], "sample": _meta_sample(meta)})
    if name == "echo":
        return text_result(str(args.get("text", "")))
    if name == "sleep":
        start = time.time()
        await asyncio.sleep(float(args.get("seconds", 0)))
        return text_result({"tag": args.get("tag"), "start": start, "end": time.time(), "pid": os.getpid()})
    if name == "fail":
        return text_result(str(args.get("message", "failed on purpose")), is_error=True)
    if name == "crash":
        raise RuntimeError("crashed on purpose")
    return text_result(f"unknown tool {name!r}", is_error=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_transport_args(parser)
    args = parser.parse_args()
    serve(build_server("agentbatch-probe", TOOLS, call, with_meta=True), args.http)


if __name__ == "__main__":
    main()
