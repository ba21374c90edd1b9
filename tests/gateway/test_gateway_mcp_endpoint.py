"""`/mcp` answers a tool call itself (`gateway/mcp_endpoint.py`) as the `mcp` SDK's transport answers
it: every request here is sent twice, once answered by the endpoint and once by the SDK (the endpoint
switched off), and the two answers must be the same (status, content type, JSON-RPC message)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_helpers import gateway_config, serve_gateway, sim_workers
from mcp import Client
from testkit import free_port, listens, wait_until

from agentbatch.db.store import Store
from agentbatch.environments.mcp_client import McpServerSpec
from agentbatch.gateway import mcp_endpoint
from agentbatch.gateway.server import RunningGateway

VERSION = "2026-07-28"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json",
           "mcp-protocol-version": VERSION, "mcp-method": "tools/call"}
# the echo tool's schema with an Mcp-Param header declared on its argument
PARAM_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "x-mcp-header": "Text"}},
                "required": ["text"]}


def tool_call(name: Any, arguments: Any = None, *, sample: Any = "s1", request_id: Any = 1,
              headers: dict[str, str] | None = None, **extra: Any) -> tuple[Any, dict[str, str]]:
    """A `tools/call` as the SDK client sends it (body, headers), with the given changes."""
    meta = {**ENVELOPE, **({"agentbatch/sample": sample} if sample is not None else {})}
    params = {"_meta": meta, "name": name, **({"arguments": arguments} if arguments is not None else {})}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params, **extra}
    return body, {**HEADERS, **({"mcp-name": name} if isinstance(name, str) else {}), **(headers or {})}


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def cases() -> dict[str, tuple[Any, Any]]:
    success = tool_call("echo", {"text": "hé"})
    body, headers = success
    return {
        "success": success,
        "tool error": tool_call("fail", {"message": "no"}),
        "unknown tool": tool_call("nope", {}),
        "no arguments": tool_call("fail"),
        "no sample id": tool_call("echo", {"text": "x"}, sample=None),
        "sample id in a header": tool_call("echo", {"text": "x"}, sample=None, headers={"x-agentbatch-sample": "h1"}),
        "bad sample id": tool_call("echo", {"text": "x"}, sample="a\x01b"),
        "string id": tool_call("echo", {"text": "x"}, request_id="abc"),
        "float id": tool_call("echo", {"text": "x"}, request_id=1.5),
        "arguments not an object": tool_call("echo", "x"),
        "no name": (dict(body, params=without(body["params"], "name")), without(headers, "mcp-name")),
        "name not a string": tool_call(7, {}),
        "name header differs": tool_call("echo", {"text": "x"}, headers={"mcp-name": "fail"}),
        "method header differs": tool_call("echo", {"text": "x"}, headers={"mcp-method": "tools/list"}),
        "no version header": (body, without(headers, "mcp-protocol-version")),
        "unsupported version": (dict(body, params=dict(body["params"], _meta={
            **ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"})),
            dict(headers, **{"mcp-protocol-version": "2099-01-01"})),
        "no envelope": (dict(body, params=without(body["params"], "_meta")), headers),
        "progress token": (dict(body, params=dict(body["params"], _meta={**ENVELOPE, "progressToken": 5})), headers),
        "extra member": tool_call("echo", {"text": "x"}, extra=1),
        "notification": (without(body, "id"), headers),
        "batch": ([body], headers),
        "not JSON": (b'{"jsonrpc": ', headers),
        "other method": ({**body, "method": "tools/list", "params": {"_meta": ENVELOPE}},
                         dict(without(headers, "mcp-name"), **{"mcp-method": "tools/list"})),
        "JSON only accepted": (body, dict(headers, accept="application/json")),
        "not JSON content": (body, dict(headers, **{"content-type": "text/plain"})),
        "foreign origin": (body, dict(headers, origin="http://evil.example")),
        "repeated routing header": (body, [*headers.items(), ("mcp-method", "tools/call")]),
    }


def param_cases() -> dict[str, tuple[Any, Any]]:
    """Calls of a tool that declares an Mcp-Param header (its schema patched on the gateway)."""
    return {
        "param header matches": tool_call("echo", {"text": "hi"}, headers={"mcp-param-text": "hi"}),
        "param header differs": tool_call("echo", {"text": "hi"}, headers={"mcp-param-text": "ho"}),
        "param header missing": tool_call("echo", {"text": "hi"}),
        "param header without argument": tool_call("echo", {}, headers={"mcp-param-text": "hi"}),
    }


def parse(response: httpx.Response) -> tuple[int, str, Any]:
    kind = response.headers.get("content-type", "")
    if "text/event-stream" in kind:
        events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return response.status_code, kind, [json.loads(e) for e in events]
    if kind == "application/json":
        return response.status_code, kind, response.json()
    return response.status_code, kind, response.text


async def answers(gw: RunningGateway, requests: dict[str, tuple[Any, Any]], *, direct: bool
                  ) -> tuple[dict[str, Any], set[str]]:
    """Each request's answer, and the requests the endpoint answered itself."""
    endpoint = gw.gateway.tools.endpoint
    assert endpoint is not None
    endpoint.enabled = direct
    out, served = {}, set()
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        for label, (body, headers) in requests.items():
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            before = endpoint.served
            out[label] = parse(await http.post("/mcp", content=content, headers=headers))
            if endpoint.served > before:
                served.add(label)
    return out, served


def recorded(store: Store, batch_id: int, n: int) -> list[tuple[str, int, str]] | None:
    """(sample, step index, status) of the batch's steps once `n` of them have ended."""
    ended = [s for s in store.steps(batch_id) if s.status != "running"]
    rows = {s.id: s.task_id for s in store.samples(batch_id)}  # read after: a step's sample row is older
    steps = [(rows[s.sample_id], s.index, s.status) for s in ended]
    return steps if len(steps) == n else None


@pytest.fixture
def probe_url() -> Iterator[str]:
    """The probe MCP server over streamable HTTP (stateless: the gateway calls it straight over HTTP)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentbatch.environments.mcp_servers.probe_server",
                             "--http", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: listens(port), 60, "the probe server", alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def gateway(sqlite_url, probe_url) -> Iterator[tuple[RunningGateway, Store]]:
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints, env_slots=4), endpoints,
                           upstreams=[McpServerSpec(name="probe", url=probe_url)]) as gw:
            assert gw.gateway.tools.direct  # the upstream side is the direct HTTP path too
            yield gw, store


def test_the_endpoint_answers_as_the_sdk_does(gateway):
    gw, _ = gateway
    endpoint = gw.gateway.tools.endpoint
    assert endpoint is not None

    async def main() -> tuple[dict, dict, dict, dict, set[str]]:
        (sdk, none), (fast, served) = await answers(gw, cases(), direct=False), await answers(gw, cases(), direct=True)
        schemas = gw.gateway.tools.schemas
        schemas["echo"], plain = PARAM_SCHEMA, schemas["echo"]
        try:
            (sdk_params, _), (fast_params, served_params) = (await answers(gw, param_cases(), direct=False),
                                                             await answers(gw, param_cases(), direct=True))
        finally:
            schemas["echo"] = plain
        assert not none
        return sdk, fast, sdk_params, fast_params, served | served_params

    sdk, fast, sdk_params, fast_params, served = asyncio.run(main())
    for label in sdk:
        assert fast[label] == sdk[label], label
    for label in sdk_params:
        assert fast_params[label] == sdk_params[label], label
    # The endpoint answered the well-formed tool calls itself; the rest went to the SDK.
    assert served == {"success", "tool error", "unknown tool", "no arguments", "no sample id", "sample id in a header",
                      "bad sample id", "string id", "progress token", "param header matches"}
    status, kind, message = fast["success"]
    assert (status, kind) == (200, "application/json") and message["id"] == 1
    assert message["result"]["content"] == [{"type": "text", "text": "hé"}] and not message["result"]["isError"]
    assert fast["tool error"][2]["result"]["isError"] and fast["unknown tool"][2]["result"]["isError"]
    assert "control character" in fast["bad sample id"][2]["result"]["content"][0]["text"]
    assert fast["name header differs"][0] == 400 and fast["notification"][0] == 202
    assert fast_params["param header differs"][0] == 400 and fast_params["param header matches"][0] == 200


def test_the_calls_answered_here_are_recorded_under_their_samples(gateway):
    gw, store = gateway

    async def main() -> None:
        async with Client(gw.base_url + "/mcp") as client:
            for i in range(3):
                result = await client.call_tool("echo", {"text": f"t{i}"}, meta={"agentbatch/sample": f"c{i % 2}"})
                assert result.content[0].text == f"t{i}"

    asyncio.run(main())
    assert gw.gateway.tools.endpoint is not None and gw.gateway.tools.endpoint.served == 3
    assert sorted(wait_until(lambda: recorded(store, gw.batch_id, 3), 30, "the steps")) == [
        ("c0", 0, "completed"), ("c0", 1, "completed"), ("c1", 0, "completed")]


def test_a_long_call_turns_into_the_same_sse_stream(gateway, monkeypatch):
    """Past the window the reply is an SSE stream with keep-alive pings, then the result event."""
    from mcp.server import _streamable_http_modern as sdk_modern

    assert mcp_endpoint.PING_INTERVAL_S == sdk_modern._SSE_PING_INTERVAL
    assert mcp_endpoint.SSE_HEADERS == sdk_modern._SSE_HEADERS
    monkeypatch.setattr(mcp_endpoint, "PING_INTERVAL_S", 0.2)
    monkeypatch.setattr(sdk_modern, "_SSE_PING_INTERVAL", 0.2)
    gw, _ = gateway
    # 1.5 s at 0.2 s pings: at least two pings even when a loaded machine delays the timers by 0.5 s
    request = {"slow": tool_call("sleep", {"seconds": 1.5, "tag": "t"})}

    async def main() -> tuple[dict, dict, list[httpx.Response]]:
        raw = []
        for direct in (False, True):
            gw.gateway.tools.endpoint.enabled = direct
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
                body, headers = request["slow"]
                raw.append(await http.post("/mcp", json=body, headers=headers))
        return parse(raw[0]), parse(raw[1]), raw

    sdk, fast, raw = asyncio.run(main())
    for answer in (sdk, fast):
        status, kind, (message,) = answer
        assert (status, kind) == (200, "text/event-stream")
        ran = json.loads(message["result"]["content"][0]["text"])
        assert ran["tag"] == "t" and ran["end"] - ran["start"] > 1.4
        message["result"]["content"] = []  # the times differ
    assert fast == sdk
    assert all(r.text.startswith(": ping\r\n\r\n") and r.text.count(": ping") >= 2 for r in raw)
    assert raw[1].headers.get("cache-control") == raw[0].headers.get("cache-control") == "no-cache, no-transform"


@pytest.mark.parametrize("direct", [True, False])
def test_a_client_that_disconnects_cancels_its_call(gateway, direct):
    gw, store = gateway
    from test_gateway_tools import wait_for

    async def main() -> None:
        gw.gateway.tools.endpoint.enabled = direct
        body, headers = tool_call("sleep", {"seconds": 30}, sample="gone")
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
            task = asyncio.create_task(http.post("/mcp", json=body, headers=headers))
            await wait_for(gw.base_url, lambda s: s["in_use"]["environment"] == 1)
            task.cancel()
        await wait_for(gw.base_url, lambda s: s["in_use"]["environment"] == 0, timeout_s=10)

    asyncio.run(main())
    assert wait_until(lambda: recorded(store, gw.batch_id, 1), 30, "the step") == [("gone", 0, "failed")]
    assert gw.gateway.tools.endpoint.served == int(direct)
