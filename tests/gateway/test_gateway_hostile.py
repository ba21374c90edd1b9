"""Hostile and broken input: every error path gives back the slots it took, every answered request
has its step row and every refused one none, the shutdown cancels what is in flight, and the door
(Host allow-list, body limit, stalled and half-sent connections) holds."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
from gateway_helpers import MODEL, gateway_config, serve_gateway, sim_workers
from test_gateway_tools import UPSTREAMS

from agentbatch.db.store import Store
from agentbatch.gateway.forward import WorkerEndpoint
from agentbatch.gateway.state import GatewaySettings
from agentbatch.protocols.retry import RetryPolicy

CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def status(base_url: str) -> dict:
    return httpx.get(base_url + "/v1/batch").json()


def idle(base_url: str, timeout_s: float = 30.0) -> dict:
    """The batch status once no step holds a slot (the gateway gave everything back)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = status(base_url)
        if not any(s["in_use"][gate] for gate in s["in_use"] if gate != "admission"):
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.02)


def test_malformed_requests_take_nothing_and_write_nothing(sqlite_url):
    """`"stream": true, "stream_options": "bogus"` used to take the admission and worker slots and keep
    them: seven such requests held every slot. Now each malformed body is a 400 before anything."""
    store = Store(sqlite_url)
    bad_bodies = [{**CHAT, "stream": True, "stream_options": "bogus"}, {**CHAT, "stream": "yes"},
                  {**CHAT, "messages": ["hi"]}, {**CHAT, "messages": []}, {**CHAT, "tools": {"a": 1}}, [1, 2]]
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, max_active_samples=1, per_worker_inflight=1)
        with serve_gateway(store, config, endpoints) as gw:
            url = gw.base_url + "/v1/chat/completions"
            refused = [httpx.post(url, json=body, timeout=30) for body in bad_bodies * 2]
            refused.append(httpx.post(url, content=b"{not json", timeout=30))
            after = status(gw.base_url)
            ok = httpx.post(url, json={**CHAT, "user": "fine"}, timeout=30)
            batch_id = gw.batch_id
    assert [r.status_code for r in refused] == [400] * len(refused)
    assert "stream_options" in refused[0].json()["error"]["message"]
    assert after["samples"] == 0 and all(v == 0 for v in after["in_use"].values())
    assert ok.status_code == 200
    (sample,) = store.samples(batch_id)
    assert sample.task_id == "fine" and len(store.steps(batch_id)) == 1


def test_worker_errors_are_answered_recorded_and_give_the_slots_back(sqlite_url):
    """A worker's 4xx is passed on, an unexpected failure inside the gateway is a 500: each has its
    failed step row and the slots go back."""
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, max_active_samples=4, per_worker_inflight=1)
        with serve_gateway(store, config, endpoints, settings=GatewaySettings(metrics_interval_s=0)) as gw:
            url = gw.base_url + "/v1/chat/completions"
            rejected = httpx.post(url, json={**CHAT, "user": "a", "max_tokens": -5}, timeout=30)
            pool = gw.gateway.state.pool
            real_body_for = pool.body_for

            def broken(*args, **kwargs):  # a bug in the gateway, after the slots were taken
                raise RuntimeError("boom")

            pool.body_for = broken
            crashed = httpx.post(url, json={**CHAT, "user": "b"}, timeout=30)
            pool.body_for = real_body_for
            after = idle(gw.base_url)
            ok = httpx.post(url, json={**CHAT, "user": "c"}, timeout=30)
            batch_id = gw.batch_id
    assert 400 <= rejected.status_code < 500
    assert crashed.status_code == 500 and "RuntimeError" in crashed.json()["error"]["message"]
    assert ok.status_code == 200 and after["failed"] == 2
    steps = {s.sample_id: s for s in store.steps(batch_id)}
    rows = {s.task_id: s.id for s in store.samples(batch_id)}
    assert steps[rows["a"]].status == "failed" and "HTTP 4" in steps[rows["a"]].error
    assert steps[rows["b"]].status == "failed" and "boom" in steps[rows["b"]].error
    assert steps[rows["c"]].status == "completed"


@contextlib.contextmanager
def raw_worker(answer: bytes, hang_s: float = 0.0) -> Iterator[str]:
    """A misbehaving worker: whatever the request, it sends `answer`, waits `hang_s` and hangs up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(hang_s)
        writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:

        async def stop() -> None:
            server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            await asyncio.sleep(0.05)
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        thread.join(10)


HALF_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\": \"x\""
FIRST_EVENT = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
               b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "hel"}}]}\n\n')


def test_worker_breaking_off_its_answer_is_a_502_and_a_failed_step(sqlite_url):
    store = Store(sqlite_url)
    with raw_worker(HALF_ANSWER) as url:  # promises 1000 bytes, sends 10 and hangs up
        endpoints = [WorkerEndpoint("w0", url, MODEL)]
        config = gateway_config(endpoints, max_active_samples=4, per_worker_inflight=1)
        settings = GatewaySettings(metrics_interval_s=0, retry=RetryPolicy(inference=0))
        with serve_gateway(store, config, endpoints, settings=settings) as gw:
            answers = [httpx.post(gw.base_url + "/v1/chat/completions", json={**CHAT, "user": f"s{i}"}, timeout=30)
                       for i in range(3)]  # one slot each: a leak would hang the second
            after = idle(gw.base_url)
            batch_id = gw.batch_id
    assert [a.status_code for a in answers] == [502] * 3 and "broke off" in answers[0].json()["error"]["message"]
    assert after["failed"] == 3
    assert [s.status for s in store.steps(batch_id)] == ["failed"] * 3


def test_a_worker_5xx_is_retried_then_passed_on(sqlite_url):
    """Each 5xx answer is a failed attempt, retried; when the retries run out the harness gets the
    worker's own last answer."""
    body = b'{"error": "too busy"}'
    busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)
    store = Store(sqlite_url)
    with raw_worker(busy) as url:
        endpoints = [WorkerEndpoint("w0", url, MODEL)]
        settings = GatewaySettings(metrics_interval_s=0, retry=RetryPolicy(inference=1, backoff_s=0.01))
        with serve_gateway(store, gateway_config(endpoints), endpoints, settings=settings) as gw:
            answer = httpx.post(gw.base_url + "/v1/chat/completions", json={**CHAT, "user": "busy"}, timeout=30)
            after = idle(gw.base_url)
            batch_id = gw.batch_id
    assert (answer.status_code, answer.content) == (503, body)
    assert after["failed"] == 1
    steps = store.steps(batch_id)
    assert [(s.attempt, s.status) for s in steps] == [(1, "failed"), (2, "failed")]
    assert all("HTTP 503" in (s.error or "") and "too busy" in (s.error or "") for s in steps)


def test_client_leaving_a_stream_gives_the_slot_back(sqlite_url):
    store = Store(sqlite_url)
    with raw_worker(FIRST_EVENT, hang_s=60) as url:  # one event, then nothing for a minute
        endpoints = [WorkerEndpoint("w0", url, MODEL)]
        config = gateway_config(endpoints, per_worker_inflight=1)
        with serve_gateway(store, config, endpoints, settings=GatewaySettings(metrics_interval_s=0)) as gw:
            body = {**CHAT, "user": "gone", "stream": True}
            with httpx.stream("POST", gw.base_url + "/v1/chat/completions", json=body, timeout=30) as r:
                assert b"hel" in next(r.iter_bytes())  # the first event, then the client hangs up
            after = idle(gw.base_url)
            batch_id = gw.batch_id
    assert after["failed"] == 1
    (step,) = store.steps(batch_id)
    assert step.status == "failed" and step.error == "stream interrupted"


def test_shutdown_cancels_steps_in_flight_and_says_so(sqlite_url):
    """A request still running when the shutdown's grace period is over: its step is recorded as cut
    off, its sample ends with the reason, and the batch says it completed with failures."""
    store = Store(sqlite_url)
    answers: list[object] = []
    with sim_workers(1, time_scale=200.0) as endpoints:
        config = gateway_config(endpoints)
        with serve_gateway(store, config, endpoints, graceful_s=0.5) as gw:
            slow = threading.Thread(target=lambda: answers.append(_post_or_error(
                gw.base_url, {**CHAT, "user": "slow", "max_tokens": 2000})))
            slow.start()
            deadline = time.monotonic() + 30
            while status(gw.base_url)["in_use"]["w0"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            batch_id = gw.batch_id
        slow.join(60)
    batch = store.get_batch(batch_id)
    assert batch.status == "completed_with_failures" and "1 step(s) cut off" in batch.error
    (step,) = store.steps(batch_id)
    assert step.status == "failed" and step.error.startswith("cancelled")
    (sample,) = store.samples(batch_id)
    assert sample.result["ended"] == "shutdown" and sample.finished_at is not None
    assert answers and not (isinstance(answers[0], httpx.Response) and answers[0].status_code == 200)


def _post_or_error(base_url: str, body: dict) -> object:
    try:
        return httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError as exc:
        return exc


def test_host_header_is_checked_on_every_route(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints), endpoints, upstreams=UPSTREAMS[1:]) as gw:
            evil = {"Host": "evil.example.com"}
            finish = httpx.post(gw.base_url + "/v1/batch/finish", headers=evil)
            chat = httpx.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=evil)
            mcp = httpx.post(gw.base_url + "/mcp", headers={**evil, "Content-Type": "application/json",
                                                            "Accept": "application/json, text/event-stream"},
                             json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            local = httpx.get(gw.base_url + "/health", headers={"Host": f"localhost:{gw.base_url.rsplit(':', 1)[1]}"})
            still = status(gw.base_url)
            batch_id = gw.batch_id
    assert [finish.status_code, chat.status_code, mcp.status_code] == [421] * 3
    assert "evil.example.com" in finish.json()["error"]["message"]
    assert local.status_code == 200 and still["requests"] == 0
    assert store.samples(batch_id) == []


def _raw(base_url: str, data: bytes, timeout_s: float = 20.0) -> bytes:
    """Send raw bytes; what comes back until the server closes the connection."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_large_stalled_and_half_sent_requests_are_cut_off(sqlite_url):
    store = Store(sqlite_url)
    settings = GatewaySettings(metrics_interval_s=0, max_body_bytes=10_000, body_timeout_s=0.5, header_timeout_s=0.5)
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints), endpoints, settings=settings) as gw:
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            declared = _raw(gw.base_url, head + b"Content-Length: 50000000\r\n\r\n")  # the body never comes
            chunked = httpx.post(gw.base_url + "/v1/chat/completions", content=iter([b"[" + b" " * 6000] * 3))
            stalled = _raw(gw.base_url, head + b"Content-Length: 100\r\n\r\n{\"model\"")
            half_head = _raw(gw.base_url, head)  # never ends its head
            silent = _raw(gw.base_url, b"")  # connects and says nothing
            ok = httpx.post(gw.base_url + "/v1/chat/completions", json={**CHAT, "user": "ok"})
            batch_id = gw.batch_id
    assert declared.startswith(b"HTTP/1.1 413") and b"50000000" in declared
    assert chunked.status_code == 413
    assert stalled.startswith(b"HTTP/1.1 408")
    assert half_head == b"" and silent == b""  # closed by the server, not by our 20 s socket timeout
    assert ok.status_code == 200 and len(store.samples(batch_id)) == 1
