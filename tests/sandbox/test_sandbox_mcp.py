"""MCP against real servers started over stdio (and one over streamable HTTP): tool listing, calls,
isError results as tool errors, concurrent calls that really overlap, a dead server as an
infrastructure failure with state rebuilt, and the BFCL backends served as MCP tools."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from testkit import free_port, listens, wait_until

from agentbatch.environments.mcp_client import McpConnection, McpServerSpec, result_text
from agentbatch.environments.mcp_env import McpWorkload, parse_call
from agentbatch.environments.registry import make_workload
from agentbatch.protocols.environment import EnvironmentFailure

PROBE = {"name": "probe", "command": sys.executable, "args": ["-m", "agentbatch.environments.mcp_servers.probe_server"]}


def call_msg(*calls: tuple[str, dict]) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}


def test_listing_calls_and_errors_over_stdio() -> None:
    async def main():
        conn = McpConnection(McpServerSpec.from_params(PROBE))
        await conn.start()
        try:
            return (
                sorted(t.name for t in conn.tools),
                await conn.call("echo", {"text": "hello"}),
                await conn.call("fail", {"message": "no such ticket"}),
                await conn.call("crash", {}),
                await conn.call("no_such_tool", {}),
            )
        finally:
            await conn.close()

    names, echo, fail, crash, unknown = asyncio.run(main())
    assert names == ["crash", "echo", "fail", "session", "sleep"]
    assert not echo.is_error and result_text(echo) == "hello"
    assert fail.is_error and result_text(fail) == "no such ticket"
    assert crash.is_error and "MCP error" in result_text(crash)  # a JSON-RPC error of a live server
    assert unknown.is_error


def test_concurrent_calls_overlap() -> None:
    """N slow calls sent at once over one session all start before any of them ends."""
    n = 8

    async def main():
        wl = McpWorkload(servers=[PROBE], tasks=[{"id": "t", "turns": ["go"]}])
        envs = [wl.create(wl.tasks()[0]) for _ in range(n)]
        try:
            for e in envs:
                await e.reset(e.task)
            results = await asyncio.gather(*(e.step(call_msg(("sleep", {"seconds": 1.0, "tag": str(i)})))
                                             for i, e in enumerate(envs)))
            return results, wl.calls.stats()
        finally:
            for e in envs:
                await e.close()
            await wl.aclose()

    results, stats = asyncio.run(main())
    spans = [json.loads(r.messages[0]["content"]) for r in results]
    assert len({s["pid"] for s in spans}) == 1  # one shared server process
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans)  # all ran at the same time
    assert stats.peak == n


def test_call_limit_is_the_environment_capacity() -> None:
    async def main():
        wl = McpWorkload(servers=[PROBE], tasks=[{"id": "t", "turns": ["go"]}], max_calls=2, parallel_calls=True)
        env = wl.create(wl.tasks()[0])
        try:
            await env.reset(env.task)
            res = await env.step(call_msg(*[("sleep", {"seconds": 0.3, "tag": str(i)}) for i in range(6)]))
            return res, wl.calls.stats()
        finally:
            await env.close()
            await wl.aclose()

    res, stats = asyncio.run(main())
    spans = sorted((json.loads(m["content"]) for m in res.messages), key=lambda s: s["start"])
    events = sorted([(s["start"], 1) for s in spans] + [(s["end"], -1) for s in spans])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 2 and stats.peak == 2 and res.tool_calls == 6


def test_environment_turns_tool_errors_and_hidden_tools() -> None:
    async def main():
        wl = make_workload("mcp", {"servers": [PROBE], "tasks": [
            {"id": "t", "turns": ["first", "second"], "check": {"tool": "echo", "arguments": {"text": "x"}, "expect": "x"}}]})
        env = wl.create(wl.tasks()[0])
        try:
            reset = await env.reset(env.task)
            r1 = await env.step(call_msg(("echo", {"text": "a"}), ("fail", {}), ("nope", {})))
            r2 = await env.step({"role": "assistant", "content": "done with turn 1"})
            r3 = await env.step({"role": "assistant", "content": "done"})
            return reset, r1, r2, r3, await env.score()
        finally:
            await env.close()
            await wl.aclose()

    reset, r1, r2, r3, score = asyncio.run(main())
    assert sorted(t["function"]["name"] for t in reset.tools) == ["crash", "echo", "fail", "session", "sleep"]
    assert reset.messages == [{"role": "user", "content": "first"}]
    assert (r1.tool_calls, r1.tool_errors, r1.done) == (3, 2, False)
    assert r2.messages == [{"role": "user", "content": "second"}] and not r2.done
    assert r3.done and score["score"] == 1.0


def test_dead_per_sample_server_is_a_failure_then_rebuilt() -> None:
    async def main():
        wl = McpWorkload(servers=[PROBE], tasks=[{"id": "t", "turns": ["go"]}], per_sample=True)
        env = wl.create(wl.tasks()[0])
        try:
            await env.reset(env.task)
            first = await env.step(call_msg(("sleep", {"seconds": 0})))
            pid = json.loads(first.messages[0]["content"])["pid"]
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
            with pytest.raises(EnvironmentFailure):
                await env.step(call_msg(("echo", {"text": "x"})))
            retried = await env.step(call_msg(("sleep", {"seconds": 0})))  # the flow's retry
            return pid, json.loads(retried.messages[0]["content"])["pid"]
        finally:
            await env.close()
            await wl.aclose()

    old, new = asyncio.run(main())
    assert old != new


def test_streamable_http_server() -> None:
    port = free_port()
    proc = subprocess.Popen([*([PROBE["command"]] + PROBE["args"]), "--http", f"127.0.0.1:{port}"])
    try:
        wait_until(lambda: listens(port, 0.5), 30, f"the MCP server on port {port}", alive=lambda: proc.poll() is None)

        async def main():
            conn = McpConnection(McpServerSpec(name="http", url=f"http://127.0.0.1:{port}/mcp"))
            await conn.start()
            try:
                return [t.name for t in conn.tools], await conn.call("echo", {"text": "over http"})
            finally:
                await conn.close()

        names, res = asyncio.run(main())
        assert "echo" in names and result_text(res) == "over http"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_parse_bfcl_calls() -> None:
    import inspect

    def sort(file_name: str) -> None: ...

    assert parse_call("mv(source='a', destination='b')") == {"name": "mv", "arguments": {"source": "a", "destination": "b"}}
    assert parse_call("sort('r.pdf')", {"sort": inspect.signature(sort)}) == {"name": "sort", "arguments": {"file_name": "r.pdf"}}


@pytest.mark.slow
def test_bfcl_backends_over_mcp_score_ground_truth_and_reject_corruption() -> None:
    async def play(wl, task, skip_first: bool):
        env = wl.create(task)
        try:
            reset = await env.reset(task)
            for i, turn in enumerate(task.data["ground_truth"]):
                if turn and not (skip_first and i == 0):
                    await env.step(call_msg(*[(c["name"], c["arguments"]) for c in turn]))
                await env.step({"role": "assistant", "content": "ok"})
            return reset, await env.score()
        finally:
            await env.close()

    async def main():
        wl = make_workload("mcp", {"preset": "bfcl", "limit": 3})
        try:
            tasks = wl.tasks()
            good = await asyncio.gather(*(play(wl, t, False) for t in tasks))
            bad = await play(wl, tasks[0], True)
            return good, bad
        finally:
            await wl.aclose()

    good, bad = asyncio.run(main())
    for reset, score in good:
        names = {t["function"]["name"] for t in reset.tools}
        assert "agentbatch_state" not in names and "ls" in names
        assert reset.tools[0]["function"]["parameters"]["type"] == "object"
        assert score["score"] == 1.0
    assert bad[1]["score"] == 0.0
