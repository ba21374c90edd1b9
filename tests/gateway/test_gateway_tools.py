"""The MCP tool gateway: an MCP client (streamable HTTP) calls tools of real upstream MCP servers (the
project's BFCL server, and the probe server's slow `sleep`) through the environment-slot gate."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import httpx
import pytest
from gateway_helpers import gateway_config, serve_gateway, sim_workers
from mcp import Client
from testkit import max_overlap

from agentbatch.db.store import Store
from agentbatch.environments.mcp_client import McpServerSpec

UPSTREAMS = [
    McpServerSpec(name="bfcl", command=sys.executable,
                  args=["-m", "agentbatch.environments.mcp_servers.bfcl_server", "--classes", "MathAPI"]),
    McpServerSpec(name="probe", command=sys.executable,
                  args=["-m", "agentbatch.environments.mcp_servers.probe_server"]),
]


def meta(sample: str) -> dict:
    return {"agentbatch/sample": sample}


async def wait_for(base_url: str, predicate, timeout_s: float = 60.0) -> dict:
    """Poll the gateway's batch status until `predicate(status)` holds."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as http:
        while True:
            status = (await http.get(base_url + "/v1/batch")).json()
            if predicate(status):
                return status
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.02)


def test_tool_calls_never_exceed_the_slots(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, env_slots=2, max_active_samples=16)
        with serve_gateway(store, config, endpoints, upstreams=UPSTREAMS) as gw:

            async def main() -> tuple[list, list]:
                async with Client(gw.base_url + "/mcp") as client:
                    names = {t.name for t in (await client.list_tools()).tools}
                    assert {"add", "multiply", "sleep", "echo"} <= names
                    assert not any(n.startswith("agentbatch_") for n in names)
                    sleeps = [client.call_tool("sleep", {"seconds": 0.3, "tag": f"s{i}"}, meta=meta(f"s{i}"))
                              for i in range(6)]
                    adds = [client.call_tool("add", {"a": i, "b": 10}, meta=meta(f"s{i}")) for i in range(6)]
                    results = await asyncio.gather(*sleeps, *adds)
                    bad = await client.call_tool("divide", {"a": 1, "b": 0}, meta=meta("s0"))
                    return results, [bad]

            results, (bad,) = asyncio.run(main())
            batch_id = gw.batch_id

    sleeps, adds = results[:6], results[6:]
    assert [json.loads(r.content[0].text)["result"] for r in adds] == [i + 10 for i in range(6)]
    assert bad.is_error  # the upstream's own tool error comes back as it is
    # On the upstream's side (its own clocks): never more than 2 sleeps at once, and 2 did overlap.
    ran = [json.loads(r.content[0].text) for r in sleeps]
    assert max_overlap([(r["start"], r["end"]) for r in ran]) == 2
    # In the store: one environment step per call, the slot as worker, intervals within the slots.
    steps = store.steps(batch_id)
    assert len(steps) == 13 and {s.kind for s in steps} == {"environment"}
    assert {s.status for s in steps} == {"completed"} and {s.worker for s in steps} <= {"env-0", "env-1"}
    assert max_overlap([(s.started_at, s.finished_at) for s in steps]) == 2
    assert sum(1 for s in steps if (s.response or {}).get("tool_errors")) == 1
    assert {s.task_id for s in store.samples(batch_id)} == {f"s{i}" for i in range(6)}


def test_the_sample_with_more_progress_gets_the_slot_first(sqlite_url):
    """env_slots=1 is held by a slow call; then `low` (1 step done) queues a call, then `high` (4 steps
    done, 3 of them inference requests through the inference gateway under the same sample id). When
    the slot frees, CAAS gives it to `high` although `low` asked first."""
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, env_slots=1, max_active_samples=8)
        with serve_gateway(store, config, endpoints, upstreams=UPSTREAMS) as gw:

            async def main() -> None:
                async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
                    for sample, n in (("high", 3), ("low", 1)):
                        for i in range(n):
                            r = await http.post("/v1/chat/completions", headers={"X-Agentbatch-Sample": sample},
                                                json={"model": "tiny-cpu", "max_tokens": 4,
                                                      "messages": [{"role": "user", "content": f"turn {i}"}]})
                            assert r.status_code == 200
                async with Client(gw.base_url + "/mcp") as client:
                    await client.call_tool("add", {"a": 1, "b": 1}, meta=meta("high"))  # high: 4 steps
                    holder = asyncio.create_task(client.call_tool("sleep", {"seconds": 4}, meta=meta("holder")))
                    await wait_for(gw.base_url, lambda s: s["in_use"]["environment"] == 1)
                    low = asyncio.create_task(client.call_tool("add", {"a": 2, "b": 2}, meta=meta("low")))
                    await wait_for(gw.base_url, lambda s: s["waiting"]["environment"] == 1)
                    high = asyncio.create_task(client.call_tool("add", {"a": 3, "b": 3}, meta=meta("high")))
                    await wait_for(gw.base_url, lambda s: s["waiting"]["environment"] == 2)
                    await asyncio.gather(holder, low, high)

            asyncio.run(main())
            batch_id = gw.batch_id

    samples = {s.id: s.task_id for s in store.samples(batch_id)}
    env = {}
    for s in store.steps(batch_id):
        if s.kind == "environment":
            env.setdefault(samples[s.sample_id], []).append(s)
    holder, low, high = env["holder"][0], env["low"][0], max(env["high"], key=lambda s: s.index)
    # Both asked while the slot was held (so the order was the queue's choice) ...
    assert low.enqueued_at < high.enqueued_at < holder.finished_at
    # ... and the sample with more progress went first.
    assert holder.finished_at <= high.started_at < low.started_at
    assert high.index == 4 and low.index == 1  # progress counted over both gateways


def test_a_tool_call_is_retried_only_when_it_cannot_have_reached_the_tool(sqlite_url):
    """The probe upstream is killed while a call runs on it: that call may have run, so it is not
    repeated (one failed attempt, an isError result). The next call is not sent to the dead upstream:
    the gateway starts it again and retries (a failed attempt, then a completed one)."""
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, env_slots=2, max_active_samples=4)
        with serve_gateway(store, config, endpoints, upstreams=UPSTREAMS) as gw:

            async def main() -> tuple:
                async with Client(gw.base_url + "/mcp") as client:
                    ran = await client.call_tool("sleep", {"seconds": 0}, meta=meta("probe-pid"))
                    slow = asyncio.create_task(client.call_tool("sleep", {"seconds": 30}, meta=meta("in-flight")))
                    await wait_for(gw.base_url, lambda s: s["in_use"]["environment"] == 1)
                    os.kill(json.loads(ran.content[0].text)["pid"], signal.SIGKILL)
                    cut = await slow
                    echoed = await client.call_tool("echo", {"text": "again"}, meta=meta("unsent"))
                    return cut, echoed

            cut, echoed = asyncio.run(main())
            batch_id = gw.batch_id

    assert cut.is_error and "failed" in cut.content[0].text
    assert not echoed.is_error and echoed.content[0].text == "again"
    rows = {s.id: s.task_id for s in store.samples(batch_id)}
    attempts: dict[str, list] = {}
    for st in store.steps(batch_id):
        attempts.setdefault(rows[st.sample_id], []).append((st.index, st.attempt, st.status))
    assert attempts["in-flight"] == [(0, 1, "failed")]
    assert attempts["unsent"] == [(0, 1, "failed"), (0, 2, "completed")]


def _session_state(result) -> dict:
    return json.loads(result.content[0].text)


def test_per_sample_upstream_sessions_and_the_sample_in_meta(sqlite_url):
    """`state` keeps one session per sample (its own server process here), `shared` one for all; both
    are told the calling sample in `_meta`. A sample's session closes when the sample ends."""
    from agentbatch.gateway.state import GatewaySettings

    upstreams = [McpServerSpec(name=n, command=sys.executable,
                               args=["-m", "agentbatch.environments.mcp_servers.probe_server"])
                 for n in ("state", "shared")]
    store = Store(sqlite_url)
    settings = GatewaySettings(per_sample_upstreams=("state",), metrics_interval_s=0)
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints, env_slots=4), endpoints, upstreams=upstreams,
                           settings=settings) as gw:

            async def main() -> dict[str, list[dict]]:
                out: dict[str, list[dict]] = {"A": [], "B": [], "shared": []}
                async with Client(gw.base_url + "/mcp") as client:
                    for key in ("A", "B", "A"):
                        out[key].append(_session_state(await client.call_tool("state__session", {}, meta=meta(key))))
                    for key in ("A", "B"):
                        out["shared"].append(_session_state(
                            await client.call_tool("shared__session", {}, meta=meta(key))))
                    assert httpx.post(gw.base_url + "/v1/samples/A/finish").status_code == 200
                    await wait_for(gw.base_url, lambda s: s["ended"] == 1)
                    out["A"].append(_session_state(await client.call_tool("state__session", {}, meta=meta("A"))))
                return out

            seen = asyncio.run(main())
            batch_id = gw.batch_id
    a, b, shared = seen["A"], seen["B"], seen["shared"]
    assert [(s["calls"], s["sample"]) for s in a] == [(1, "A"), (2, "A"), (1, "A")]  # a fresh session after the end
    assert a[0]["pid"] == a[1]["pid"] != a[2]["pid"] and b[0]["pid"] not in (a[0]["pid"], a[2]["pid"])
    assert [(s["calls"], s["sample"]) for s in b] == [(1, "B")]
    assert shared[0]["pid"] == shared[1]["pid"] and [s["sample"] for s in shared] == ["A", "B"]
    assert shared[1]["calls"] == shared[0]["calls"] + 1
    assert all(s.status == "completed" for s in store.steps(batch_id))
    for pid in {a[0]["pid"], a[2]["pid"], b[0]["pid"]}:  # every per-sample session closed, its process gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_call_whose_owner_process_is_unreachable_is_a_tool_error():
    """With several processes a call of a sample another process owns goes to that process; when it
    cannot be reached the harness gets an isError result naming the owner, nothing raises."""
    from types import SimpleNamespace

    from testkit import free_port

    from agentbatch.gateway.state import GatewaySettings
    from agentbatch.gateway.tools import ToolGateway

    state = SimpleNamespace(settings=GatewaySettings(), registry=SimpleNamespace(on_end=[]))
    tools = ToolGateway([], state)  # type: ignore[arg-type]  # only the parts a forwarded call reads
    dead = f"http://127.0.0.1:{free_port()}"
    tools.owner_url = lambda key: dead if key == "elsewhere" else None

    async def main() -> None:
        result = await tools.call("elsewhere", "echo", {"text": "x"})
        assert result.is_error
        assert "owning sample 'elsewhere' is unreachable" in result.content[0].text
        await tools.aclose()

    asyncio.run(main())
