"""Tool calls sent straight over HTTP to a stateless streamable-HTTP upstream (`gateway/mcp_direct.py`)
give what the `mcp` client SDK gives for the same calls, and fail the way it fails; they share kept-alive
connections."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
import uvloop
from testkit import free_port, listens, wait_until

from agentbatch.environments.mcp_client import McpConnection, McpServerSpec
from agentbatch.gateway.mcp_direct import DirectCaller
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable


def start_probe(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "agentbatch.environments.mcp_servers.probe_server",
                             "--http", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: listens(port), 60, "the probe server", alive=lambda: proc.poll() is None)
    return proc


@pytest.fixture
def probe_url() -> Iterator[str]:
    port = free_port()
    proc = start_probe(port)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.asynccontextmanager
async def direct_caller(url: str, call_timeout_s: float) -> AsyncIterator[DirectCaller]:
    """A started SDK connection to `url` and the direct caller beside it (closed on the way out)."""
    conn = McpConnection(McpServerSpec(name="probe", url=url), call_timeout_s=call_timeout_s)
    await conn.start()
    direct = DirectCaller.of(conn)
    assert direct is not None
    try:
        yield direct
    finally:
        direct.close()
        await conn.close()


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])  # the gateway runs on uvloop
def test_direct_calls_answer_as_the_sdk_does(probe_url, run):
    calls = [("echo", {"text": "hi"}), ("nope", {"text": "x"}), ("fail", {}), ("echo", {"wrong": 1})]

    async def main() -> tuple[list, list, set[str]]:
        async with direct_caller(probe_url, 30) as direct:
            meta = {"agentbatch/sample": "s1"}
            fast = [await direct.call(name, args, meta=meta) for name, args in calls]
            sdk = [await direct.conn.call(name, args, meta=meta) for name, args in calls]
            return fast, sdk, direct.direct

    fast, sdk, covered = run(main())
    assert {"echo", "fail", "session"} <= covered
    assert fast == sdk
    assert fast[0].content[0].text == "hi" and not fast[0].is_error
    assert fast[1].is_error and fast[2].is_error  # an unknown tool, a tool that fails: tool errors


def test_a_stopped_upstream_is_unreachable_and_a_stuck_one_times_out(probe_url):
    async def main() -> None:
        async with direct_caller(probe_url, 0.5) as direct:
            with pytest.raises(EnvironmentFailure, match="no answer"):
                await direct.call("sleep", {"seconds": 5})
            direct.conn.spec.url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
            with pytest.raises(EnvironmentUnreachable):
                await direct.call("echo", {"text": "x"})

    asyncio.run(main())


def test_calls_share_a_kept_alive_connection_and_drop_one_the_upstream_closed():
    port = free_port()
    procs = [start_probe(port)]

    async def main() -> None:
        async with direct_caller(f"http://127.0.0.1:{port}/mcp", 30) as direct:
            for i in range(5):
                assert (await direct.call("echo", {"text": f"t{i}"})).content[0].text == f"t{i}"
            assert len(direct.pool.idle) == 1  # one connection carried the five calls
            await asyncio.gather(*(direct.call("sleep", {"seconds": 0.2}) for _ in range(3)))
            assert len(direct.pool.idle) == 3  # concurrent calls: a connection each, all kept
            procs[0].terminate()  # the upstream goes away and comes back on the same port
            procs[0].wait(timeout=30)
            procs.append(start_probe(port))
            await asyncio.sleep(0.2)  # the loop sees the old connections close
            result = await direct.call("echo", {"text": "again"})
            assert result.content[0].text == "again" and not result.is_error
            assert len(direct.pool.idle) == 1

    try:
        asyncio.run(main())
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
