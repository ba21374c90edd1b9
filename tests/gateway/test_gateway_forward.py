"""The gateway's worker client: an endpoint whose URL holds credentials and that has an api_key too
(aiohttp refuses an Authorization header beside URL credentials) still reaches the worker."""

from __future__ import annotations

import asyncio
import json

from agentbatch.engines.sim_server import running_sim_server
from agentbatch.gateway import jsonio
from agentbatch.gateway.forward import StreamAccumulator, WorkerEndpoint, WorkerPool


def test_url_credentials_beside_an_api_key_reach_the_worker() -> None:
    with running_sim_server("tiny-cpu", worker_name="sim-auth") as base:
        url = base.replace("http://", "http://agent:pw-FORWARD@")
        pool = WorkerPool([WorkerEndpoint(name="w", base_url=url, model="tiny-cpu", api_key="sk-FORWARD")])
        assert "pw-FORWARD" not in pool.urls["w"]

        async def ask() -> int:
            response = await pool.post("w", jsonio.dumps({"model": "tiny-cpu", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]}))
            async with response:
                status = response.status
            await pool.aclose()
            return status

        assert asyncio.run(ask()) == 200


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)  # `true` and `1` differ here, not in ==


def test_the_forwarded_body_is_the_harness_body_with_the_gateways_fields() -> None:
    """Whether the harness's bytes are passed on with the gateway's fields appended or the body is
    serialised again, the worker gets the harness's body with `model` set to its own, the priority,
    `user` when the harness gave none, and usage asked for when it streams."""
    pool = WorkerPool([WorkerEndpoint(name="w", base_url="http://127.0.0.1:9/v1", model="m")])
    messages = [{"role": "user", "content": "caf\u00e9 \u2603"}]
    bodies = [
        {"model": "m", "messages": messages, "user": "u", "x_extra": {"a": [1, 2.5, None]}},  # passed on
        {"model": "other", "messages": messages},  # the model replaced: serialised again
        {"messages": messages, "priority": True, "user": None},  # `true` is not the priority 1
        {"model": "m", "messages": messages, "stream": True},
        {"model": "m", "messages": messages, "stream": True, "stream_options": {"include_usage": True}},
        {"model": "m", "messages": messages, "stream": True, "stream_options": {"include_usage": 1, "x": 2}},
    ]
    for body in bodies:
        for raw in (json.dumps(body, ensure_ascii=False).encode(), b" " + json.dumps(body).encode() + b"\n"):
            parsed, passable = jsonio.loads_passable(raw)
            sent = pool.body_for("w", parsed, priority=1, user="s", raw=raw if passable else None)
            expected = {**body, "model": "m", "priority": 1}
            expected.setdefault("user", "s")
            if body.get("stream"):
                expected["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
            assert _canonical(json.loads(sent)) == _canonical(expected), body
    raw = json.dumps(bodies[0]).encode()
    assert pool.body_for("w", json.loads(raw), priority=None, user="s", raw=raw) is raw  # nothing to change
    assert pool.body_for("w", json.loads(raw), priority=1, user="s", raw=raw).startswith(raw[:-1])


def _sse(chunk: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"


def test_a_stream_is_passed_on_whole_events_at_a_time_and_rebuilt() -> None:
    """However the worker's bytes are cut, the events pass on whole and in order (the usage-only one
    dropped when the client did not ask for it), and the assistant message and usage are rebuilt."""
    stream = b"".join([
        _sse({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}),
        b": a comment line\r\ndata: {\"id\": \"c1\", \"choices\": [{\"index\": 0,\r\ndata: \"delta\": {\"content\": \"lo\"}}]}\r\n\r\n",
        _sse({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "t0", "function": {"name": "look", "arguments": "{\"q\""}}]}}]}),
        _sse({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]}),
        _sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        b"data: [DONE]\r\n\r\n",
    ])
    plain = stream.replace(b"\r\n", b"\n")
    events = plain.split(b"\n\n")[:-1]
    for data, cut in [(plain, 1), (plain, 7), (plain, 64), (stream, 64), (stream, len(stream))]:
        for keep_usage in (True, False):
            acc = StreamAccumulator()
            out = b"".join(acc.feed(data[i:i + cut], keep_usage_chunk=keep_usage) for i in range(0, len(data), cut))
            out += acc.flush()
            kept = [e for e in events if keep_usage or b'"usage"' not in e]
            assert out == b"".join(e + b"\n\n" for e in kept), (cut, keep_usage)
            assert acc.message() == {"role": "assistant", "content": "Hello", "tool_calls": [
                {"id": "t0", "type": "function", "function": {"name": "look", "arguments": "{\"q\": 1}"}}]}
            assert acc.data()["usage"] == {"prompt_tokens": 7, "completion_tokens": 3}
            assert acc.data()["choices"] == [{"finish_reason": "tool_calls"}]
