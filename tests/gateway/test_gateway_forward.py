"""The gateway's worker client: an endpoint whose URL holds credentials and that has an api_key too
still reaches the worker, with the api_key's Authorization."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentbatch.engines.sim_server import running_sim_server
from agentbatch.gateway import jsonio
from agentbatch.gateway.forward import TRANSPORT_ERRORS, StreamAccumulator, WorkerEndpoint, WorkerPool


def test_url_credentials_beside_an_api_key_reach_the_worker() -> None:
    with running_sim_server("tiny-cpu", worker_name="sim-auth") as base:
        url = base.replace("http://", "http://agent:pw-FORWARD@")
        pool = WorkerPool([WorkerEndpoint(name="w", base_url=url, model="tiny-cpu", api_key="sk-FORWARD")])
        assert "pw-FORWARD" not in pool.urls["w"]

        async def ask() -> int:
            response = await pool.post("w", jsonio.dumps({"model": "tiny-cpu", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]}))
            status = response.status
            response.release()
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


class _Script:
    """A worker that answers each request on a connection with the next of `answers` (bytes, sent in
    the given pieces with a pause between them); it counts connections and keeps the requests."""

    def __init__(self, *answers: list[bytes], close_after: bool = False, pause_s: float = 0.05) -> None:
        self.answers = list(answers)
        self.close_after = close_after
        self.pause_s = pause_s
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                for piece in self.answers.pop(0):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(self.pause_s)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _serve(script: _Script) -> tuple[asyncio.Server, WorkerPool]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, WorkerPool([WorkerEndpoint("w", f"http://127.0.0.1:{port}/v1", "m", api_key="sk-1")], timeout_s=1.0)


def test_answers_come_whole_or_in_pieces_over_one_kept_connection() -> None:
    """A Content-Length answer is read whole, a chunked one piece by piece as it comes, over the one
    connection kept between requests; the request carries the endpoint's path, auth and the body."""
    chunked = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
               b"6\r\ndata:1\r\n", b"6\r\ndata:2\r\n", b"0\r\n\r\n"]
    whole = [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"]
    script = _Script(whole, chunked, whole)

    async def main() -> list[object]:
        server, pool = await _serve(script)
        out: list[object] = []
        for _ in range(3):
            answer = await pool.post("w", b'{"x": 1}')
            out.append((answer.status, [piece async for piece in answer.pieces()]))
            answer.release()
        out.append(len(pool._pools["w"].idle))
        await pool.aclose()
        server.close()
        return out

    first, streamed, third, idle = asyncio.run(main())
    assert first == third == (200, [b"{}"])
    assert streamed == (200, [b"data:1", b"data:2"])  # each chunk passed on by itself
    assert idle == 1 and script.connections == 1
    request = script.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and request.endswith(b'\r\n\r\n{"x": 1}')
    assert b"Authorization: Bearer sk-1\r\n" in request and b"content-length: 8\r\n" in request


def test_an_answer_that_ends_with_the_connection_is_whole_and_not_kept() -> None:
    script = _Script([b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n", b'{"a": ', b"1}"],
                     close_after=True)

    async def main() -> tuple[bytes, int]:
        server, pool = await _serve(script)
        answer = await pool.post("w", b"{}")
        body = await answer.read()
        answer.release()
        idle = len(pool._pools["w"].idle)
        server.close()
        return body, idle

    assert asyncio.run(main()) == (b'{"a": 1}', 0)


def test_a_late_or_broken_answer_raises_a_transport_error_and_drops_the_connection() -> None:
    """No byte within the timeout, a body cut short, no server at all: errors the gateway retries
    or answers with a 502 (TRANSPORT_ERRORS); the connection is not kept."""
    half = [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345", b"67890"]

    async def read(script: _Script) -> tuple[str, int]:
        server, pool = await _serve(script)
        try:
            answer = await pool.post("w", b"{}")
            try:
                await answer.read()
            finally:
                answer.release()
        except TRANSPORT_ERRORS as exc:
            return exc.__class__.__name__, len(pool._pools["w"].idle)
        finally:
            server.close()
        return "no error", len(pool._pools["w"].idle)

    assert asyncio.run(read(_Script(half, pause_s=3.0))) == ("TimeoutError", 0)  # 1 s without a byte
    assert asyncio.run(read(_Script(half[:1], close_after=True))) == ("ConnectionResetError", 0)
    assert asyncio.run(read(_Script(half))) == ("no error", 1)

    async def nobody() -> None:
        pool = WorkerPool([WorkerEndpoint("w", "http://127.0.0.1:9/v1", "m")])
        await pool.post("w", b"{}")

    with pytest.raises(TRANSPORT_ERRORS):
        asyncio.run(nobody())
