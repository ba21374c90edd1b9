"""`agentbatch gateway --processes 2` on PostgreSQL: one batch served by two processes on one port.

Samples send their requests over connections of their own (the kernel spreads them between the
processes), so most requests reach a process that does not own their sample and are forwarded to
the owner; tool calls go through /mcp the same way. The batch's limits hold across both processes:
never more samples admitted, requests at the worker or tool calls running than the limit, from the
recorded step and sample timestamps and from the worker's own count of requests in flight; every
request and tool call is recorded exactly once, under one sample row per sample."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import yaml
from aiohttp import web
from mcp import Client
from testkit import CLI, answers, free_port, max_overlap, wait_until

from agentbatch.db.models import Worker
from agentbatch.db.store import Store

SAMPLES, TURNS = 12, 3  # 12: all on one process (its share of a limit never reached) 1 time in 2,048
LIMITS = {"max_active_samples": 3, "per_worker_inflight": 2, "env_slots": 2}


class CountingWorker:
    """An OpenAI-compatible worker that answers after 30 ms with a tool call, counting the requests
    it has in flight at once."""

    def __init__(self) -> None:
        self.in_flight = self.peak = self.requests = 0
        self.port = free_port()

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.in_flight += 1
        self.requests += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.03)
        finally:
            self.in_flight -= 1
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "sleep", "arguments": "{}"}}]}
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    @contextmanager
    def running(self) -> Iterator[str]:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{self.port}/v1"
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)


async def harness(base: str) -> None:
    """SAMPLES samples at once, each TURNS x (a chat request, a tool call), then its finish."""

    async def sample(i: int) -> None:
        key = f"s{i}"
        messages = [{"role": "user", "content": f"task {i}"}]
        async with httpx.AsyncClient(timeout=60, headers={"X-Agentbatch-Sample": key}) as http, \
                Client(base + "/mcp") as mcp:
            for _ in range(TURNS):
                r = await http.post(base + "/v1/chat/completions", json={"model": "m", "messages": messages})
                assert r.status_code == 200, r.text
                result = await mcp.call_tool("sleep", {"seconds": 0.02}, meta={"agentbatch/sample": key})
                assert not result.is_error, result
                messages += [r.json()["choices"][0]["message"],
                             {"role": "tool", "tool_call_id": "call_0", "content": "slept"}]
            r = await http.post(f"{base}/v1/samples/{key}/finish", json={"score": 1})
            assert r.status_code == 200, r.text

    await asyncio.gather(*(sample(i) for i in range(SAMPLES)))


def live_members(store: Store, batch_id: int) -> list[Worker]:
    with store.session() as s:
        return list(s.query(Worker).filter(Worker.batch_id == batch_id, Worker.kind == "gateway"))


def balanced(rows: list[Worker]) -> list[Worker] | None:
    caps = [(m.metrics or {}).get("caps") or {} for m in rows]
    shares = {"admission": (2, 1), "environment": (1, 1), "w0": (1, 1)}
    ok = len(rows) == 2 and all(sorted((c.get(pool) for c in caps), reverse=True) == list(share)
                                for pool, share in shares.items())
    return rows if ok else None


def test_two_processes_hold_the_batch_limits_and_record_every_step_once(tmp_path, pg_url):
    worker = CountingWorker()
    port = free_port()
    with worker.running() as url:
        config = tmp_path / "gw.yaml"
        config.write_text(yaml.safe_dump({"name": "two-processes", "scheduling": LIMITS, "engine": {
            "kind": "openai", "params": {"endpoints": [{"name": "w0", "base_url": url, "model": "m"}]}}}))
        probe = f"probe={sys.executable} -m agentbatch.environments.mcp_servers.probe_server"
        proc = subprocess.Popen([*CLI, "gateway", "--config", str(config), "--db", pg_url, "--port", str(port),
                                 "--processes", "2", "--mcp", probe, "--no-prefect", "--no-progress"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        store = Store(pg_url)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: answers(base + "/health"), 120, "the gateway", alive=lambda: proc.poll() is None)
            (batch,) = store.list_batches()
            # Both processes up, each with its share of every limit (the first one up took all of them,
            # and gave back the other's share as it rebalanced).
            members = wait_until(lambda: balanced(live_members(store, batch.id)), 60,
                                 "both gateway processes with their shares", alive=lambda: proc.poll() is None)
            asyncio.run(harness(base))
            # Each process took a part of each limit; together no more than the limit.
            for pool, total in (("admission", 3), ("environment", 2), ("w0", 2)):
                assert sum((m.metrics or {})["caps"][pool] for m in live_members(store, batch.id)) <= total
            assert httpx.post(base + "/v1/batch/finish").status_code == 200
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, out
    assert len({m.name for m in members}) == 2
    batch = store.get_batch(batch.id)
    assert batch.status == "completed", (batch.status, batch.error, out)
    samples = store.samples(batch.id)
    assert sorted(s.task_id for s in samples) == sorted(f"s{i}" for i in range(SAMPLES))  # one row each
    assert all(s.status == "completed" and s.score == 1 for s in samples)
    steps = store.steps(batch.id)
    assert all(s.status == "completed" for s in steps), [s.error for s in steps if s.status != "completed"]
    kinds = Counter(s.kind for s in steps)
    assert kinds == {"inference": SAMPLES * TURNS, "environment": SAMPLES * TURNS}
    assert worker.requests == SAMPLES * TURNS  # each request went to the worker once
    assert len({(s.sample_id, s.index) for s in steps}) == len(steps)  # each step recorded once
    # The limits, held across both processes.
    assert worker.peak <= LIMITS["per_worker_inflight"]
    inference = [(s.started_at, s.finished_at) for s in steps if s.kind == "inference"]
    environment = [(s.started_at, s.finished_at) for s in steps if s.kind == "environment"]
    assert max_overlap(inference) <= LIMITS["per_worker_inflight"]
    assert max_overlap(environment) <= LIMITS["env_slots"]
    assert max_overlap((s.admitted_at, s.finished_at) for s in samples) <= LIMITS["max_active_samples"]
    # The limits were reached (the test could have failed): the processes shared the load.
    assert max_overlap(inference) == LIMITS["per_worker_inflight"]
    store.close()
