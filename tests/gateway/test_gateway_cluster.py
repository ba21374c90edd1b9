"""Gateway processes of one batch (`gateway/cluster.py`), driven beat by beat on one store: the
batch's limits split among the live members and rebalanced as they come and go, never more claimed
than the limit (also while a member still holds slots beyond its new share), and samples owned by
rendezvous hash (a member joining takes only samples, the others keep theirs)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentbatch.db.store import Store
from agentbatch.flows.batch import build_coordinator
from agentbatch.flows.config import BatchConfig
from agentbatch.gateway.cluster import ROUTED_HEADER, Cluster, ClusterSettings
from agentbatch.gateway.routing import PARSED_BODY, ClusterRouter
from agentbatch.scheduling.types import SampleProgress

LIMITS = {"max_active_samples": 6, "per_worker_inflight": 4, "env_slots": 3}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def member(store: Store, batch_id: int, name: str, clock: Clock) -> Cluster:
    config = BatchConfig.model_validate({"name": "c", "scheduling": LIMITS, "engine": {"kind": "openai", "params": {
        "endpoints": [{"name": "w0", "base_url": "http://127.0.0.1:1/v1", "model": "m"}]}}})
    return Cluster(store, batch_id, build_coordinator(config, ["w0"]),
                   ClusterSettings(url=f"http://{name}", ttl_s=10.0, name=name), clock=clock)


def beat(*members: Cluster) -> None:
    for m in members:
        m.beat()
        m.apply()


def capacity(m: Cluster, pool: str) -> int:
    return m.coordinator.capacities()[pool][0]


def claimed(members: list[Cluster], pool: str) -> int:
    """What the members may fill now: the larger of their capacity and what they hold."""
    return sum(max(m.coordinator.capacities()[pool]) for m in members)


def test_shares_split_rebalance_and_never_exceed_the_limit(store: Store):
    batch_id = store.create_batch("c", {}, [])
    clock = Clock()
    a = member(store, batch_id, "a", clock)
    beat(a)
    assert (capacity(a, "admission"), capacity(a, "w0"), capacity(a, "environment")) == (6, 4, 3)  # alone: all

    async def admit_four() -> None:  # a fills 4 admission slots before b comes
        for i in range(4):
            await a.coordinator.admit(SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i))

    asyncio.run(admit_four())
    b = member(store, batch_id, "b", clock)
    beat(b)
    assert capacity(b, "admission") == 0  # a claims all it had: nothing free for b yet
    for _ in range(3):
        clock.now += 1
        beat(a, b)
        for pool, total in (("admission", 6), ("w0", 4), ("environment", 3)):
            assert claimed([a, b], pool) <= total
    # a shrank to its share but still holds 4 admissions: b gets only what is left.
    assert capacity(a, "admission") == 3 and capacity(b, "admission") == 2
    for i in range(4):
        a.coordinator.finish(SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i))
    clock.now += 1
    beat(a, b)
    assert (capacity(a, "admission"), capacity(b, "admission")) == (3, 3)
    assert sorted([capacity(a, "environment"), capacity(b, "environment")]) == [1, 2]
    assert (capacity(a, "w0"), capacity(b, "w0")) == (2, 2)
    # a stops beating (gone): after the time to live b takes the whole batch.
    clock.now += 11
    beat(b)
    assert (capacity(b, "admission"), capacity(b, "w0"), capacity(b, "environment")) == (6, 4, 3)


def test_owners_agree_and_a_joining_member_only_takes_samples(store: Store):
    batch_id = store.create_batch("c", {}, [])
    clock = Clock()
    a, b = member(store, batch_id, "a", clock), member(store, batch_id, "b", clock)
    beat(a, b, a)
    keys = [f"sample-{i}" for i in range(200)]
    before = {k: a.owner(k) for k in keys}
    assert before == {k: b.owner(k) for k in keys} and set(before.values()) == {"a", "b"}
    assert all((a.url_of(k) is None) == (before[k] == "a") for k in keys)
    c = member(store, batch_id, "c", clock)
    clock.now += 1
    beat(c, a, b)
    after = {k: a.owner(k) for k in keys}
    assert after == {k: c.owner(k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert moved and all(after[k] == "c" for k in moved)  # nothing moves between a and b
    assert 30 < len(moved) < 110  # about a third


def test_a_request_served_here_is_parsed_once() -> None:
    """The router of several processes parses a chat body to find its owner; when that is this process,
    the handler gets the body's bytes and that parse, not a body to parse again."""
    class Here:
        def url_of(self, key: str) -> None:
            return None

    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "s1"}'
    seen: list[tuple[bytes, object]] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append((message["body"], scope.get(PARSED_BODY)))

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    router = ClusterRouter(app, Here())  # only url_of is used
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(router(scope, receive, None))
    [(got, kept)] = seen
    assert kept is not None and kept[0] is got and kept[1] == (json.loads(body), True)


def test_a_beat_still_running_when_the_member_leaves_does_not_bring_it_back(store: Store, monkeypatch):
    """The leave waits for a beat that is still writing (it runs in a thread, which cancelling the beat
    task does not stop), and no beat runs after it: else the beat writes the member's row back and the
    last member to leave sees it alive and does not finish the batch."""
    import threading

    from agentbatch.db import gateway_members
    from agentbatch.db.models import BatchStatus

    batch_id = store.create_batch("c", {}, [])
    clock = Clock()
    a, b = member(store, batch_id, "a", clock), member(store, batch_id, "b", clock)
    beat(a, b)
    entered, go = threading.Event(), threading.Event()
    real_beat = gateway_members.beat

    def slow_beat(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "slow-beat":
            entered.set()
            go.wait(10)
        return real_beat(*args, **kwargs)

    monkeypatch.setattr(gateway_members, "beat", slow_beat)
    beating = threading.Thread(target=a.beat, name="slow-beat")
    beating.start()
    assert entered.wait(10)
    left: list[bool] = []
    leaving = threading.Thread(target=lambda: left.append(asyncio.run(a.leave(BatchStatus.COMPLETED, None))))
    leaving.start()
    go.set()
    beating.join(10)
    leaving.join(10)
    a.beat()  # a beat after the leave writes nothing
    assert left == [False]  # b is still there
    assert asyncio.run(b.leave(BatchStatus.COMPLETED, None)) is True  # the last one finishes the batch
    assert store.get_batch(batch_id).status == "completed"


def test_a_forwarded_request_reaches_the_owner_and_its_stream_comes_back() -> None:
    """The owner gets the request as it came (hop-by-hop headers dropped, the routed mark added) and
    its answer comes back as it goes (status, content type, each piece); an owner nobody answers
    for is a 502."""
    from test_gateway_forward import _Script

    stream = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
              b"7\r\ndata: 1\r\n", b"7\r\ndata: 2\r\n", b"0\r\n\r\n"]
    script = _Script(stream)

    async def main() -> tuple[list[dict], list[dict]]:
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        owner = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        router = ClusterRouter(None, None)  # type: ignore[arg-type]  # _forward uses neither
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        headers = {"content-type": "application/json", "connection": "keep-alive", "x-agentbatch-sample": "s1"}
        await router._forward(owner, "/v1/chat/completions", headers, b'{"a": 1}', send)
        unreachable: list[dict] = []

        async def send_unreachable(message: dict) -> None:
            unreachable.append(message)

        await router._forward("http://127.0.0.1:9", "/v1/chat/completions", headers, b"{}", send_unreachable)
        await router.aclose()
        server.close()
        return sent, unreachable

    sent, unreachable = asyncio.run(main())
    assert sent[0] == {"type": "http.response.start", "status": 200,
                       "headers": [(b"content-type", b"text/event-stream")]}
    assert [m["body"] for m in sent[1:]] == [b"data: 1", b"data: 2", b""]
    request = script.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and request.endswith(b'\r\n\r\n{"a": 1}')
    assert f"{ROUTED_HEADER}: 1\r\n".encode() in request and b"x-agentbatch-sample: s1\r\n" in request
    assert b"connection:" not in request.lower()
    assert unreachable[0]["status"] == 502 and b"unreachable" in unreachable[1]["body"]
