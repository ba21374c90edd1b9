"""Gateway lifecycle: sample identification, admission and the ways a sample ends, explicit scores,
streaming pass-through, and a batch that finishes with a request in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from gateway_helpers import MODEL, gateway_config, serve_gateway, sim_workers
from openai import OpenAI

from agentbatch.db.store import Store
from agentbatch.gateway.identity import explicit_inference_id, tool_sample_key
from agentbatch.gateway.state import GatewaySettings
from agentbatch.protocols.retry import RetryPolicy


def chat(base_url: str, content: str, *, max_tokens: int = 4, headers: dict | None = None,
         **extra) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_sample_identification_order():
    body = {"user": "u1", "metadata": {"session_id": "sess"}, "messages": [{"role": "user", "content": "x"}]}
    assert explicit_inference_id({"x-agentbatch-sample": "h1"}, body) == "h1"
    assert explicit_inference_id({}, body) == "u1"
    assert explicit_inference_id({}, {**body, "user": None}) == "sess"
    assert explicit_inference_id({}, {"messages": body["messages"]}) is None  # the conversation decides
    assert tool_sample_key({"x-agentbatch-sample": "h"}, {"agentbatch/sample": "m"}) == "h"
    assert tool_sample_key({}, {"agentbatch/sample": "m"}) == "m"
    assert tool_sample_key({"mcp-session-id": "abc"}, None) == "mcp-abc"


def finish_b(base_url: str) -> None:
    """An explicit finish with a score; an unknown sample is a 404, a bad score a 400."""
    r = httpx.post(base_url + "/v1/samples/B/finish", json={"score": 0.5, "result": {"note": "ok"}})
    assert r.status_code == 200
    assert httpx.post(base_url + "/v1/samples/nobody/finish").status_code == 404
    assert httpx.post(base_url + "/v1/samples/B/finish", json={"score": "high"}).status_code == 400


def test_admission_waits_and_samples_end_on_answer_idle_and_finish(sqlite_url):
    """One admission slot: a second sample's first request waits until the first sample ends (here
    by its idle timeout; its answer does not end it with end_on_answer off)."""
    store = Store(sqlite_url)
    # yield_min_s over the idle timeout: A does not yield its slot before the idle timeout ends it.
    settings = GatewaySettings(idle_timeout_s=1.5, yield_min_s=60, end_on_answer=False, metrics_interval_s=0)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, max_active_samples=1)
        with serve_gateway(store, config, endpoints, settings=settings) as gw:
            assert chat(gw.base_url, "a1", user="A").status_code == 200
            started = time.monotonic()
            second = chat(gw.base_url, "b1", user="B")  # blocks until A is idle long enough
            waited = time.monotonic() - started
            assert second.status_code == 200
            status = httpx.get(gw.base_url + "/v1/batch").json()
            assert status["peaks"]["admission"] == 1 and status["ended"] >= 1
            finish_b(gw.base_url)
            batch_id = gw.batch_id
    assert waited >= 1.0  # B could not start before A's idle timeout ended A
    rows = {s.task_id: s for s in store.samples(batch_id)}
    assert rows["A"].result["ended"] == "idle" and rows["A"].status == "completed"
    assert rows["B"].score == 0.5 and rows["B"].result == {"ended": "finish", "note": "ok"}
    b_step = next(s for s in store.steps(batch_id) if s.sample_id == rows["B"].id)
    a_step = next(s for s in store.steps(batch_id) if s.sample_id == rows["A"].id)
    assert b_step.started_at > a_step.finished_at + 1.0


def test_answer_ends_a_sample_and_a_new_request_reopens_it(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, max_active_samples=2)
        with serve_gateway(store, config, endpoints) as gw:
            assert chat(gw.base_url, "q1", headers={"X-Agentbatch-Sample": "S"}).status_code == 200
            assert httpx.get(gw.base_url + "/v1/batch").json()["active"] == 0  # answered: ended
            assert chat(gw.base_url, "q2", headers={"X-Agentbatch-Sample": "S"}).status_code == 200
            batch_id = gw.batch_id
    (sample,) = store.samples(batch_id)
    assert sample.steps_done == 2 and sample.status == "completed" and sample.result["ended"] == "answer"
    assert [s.index for s in store.steps(batch_id)] == [0, 1]


def test_streaming_passes_through_and_is_recorded(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints)
        with serve_gateway(store, config, endpoints) as gw:
            client = OpenAI(base_url=gw.base_url + "/v1", api_key="unused")
            scripted = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "list"}], stream=True, user="st",
                extra_body={"agentbatch_response": scripted}))
            plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                   user="plain", max_tokens=3)
            batch_id = gw.batch_id
    calls = [c for ch in chunks for choice in ch.choices for c in (choice.delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("ls", "{}")]
    assert plain.usage.completion_tokens == 3
    steps = {s.request["messages"][0]["content"]: s for s in store.steps(batch_id)}
    streamed = steps["list"]
    assert streamed.response["message"]["tool_calls"][0]["function"]["name"] == "ls"
    assert streamed.prompt_tokens and streamed.output_tokens and streamed.worker == "w0"


def test_batch_finish_lets_the_request_in_flight_complete(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints)
        with serve_gateway(store, config, endpoints) as gw:
            answers: list[httpx.Response] = []
            slow = threading.Thread(target=lambda: answers.append(chat(gw.base_url, "long", max_tokens=400,
                                                                        user="slow")))
            slow.start()
            deadline = time.monotonic() + 30
            while httpx.get(gw.base_url + "/v1/batch").json()["in_use"]["w0"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert httpx.post(gw.base_url + "/v1/batch/finish").status_code == 200
            slow.join(60)
            batch_id = gw.batch_id
    assert answers and answers[0].status_code == 200 and answers[0].json()["usage"]["completion_tokens"] == 400
    assert store.get_batch(batch_id).status == "completed"
    (step,) = store.steps(batch_id)
    assert step.status == "completed" and step.output_tokens == 400


def test_unreachable_worker_is_a_502_and_a_failed_step(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        dead = [type(endpoints[0])("w0", "http://127.0.0.1:9/v1", MODEL)]
    config = gateway_config(dead)
    settings = GatewaySettings(retry=RetryPolicy(inference=1, backoff_s=0.01), metrics_interval_s=0)
    with serve_gateway(store, config, dead, settings=settings) as gw:
        r = chat(gw.base_url, "hello", user="x")
        batch_id = gw.batch_id
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    steps = store.steps(batch_id)
    assert [(s.index, s.attempt, s.status) for s in steps] == [(0, 1, "failed"), (0, 2, "failed")]


def test_concurrent_first_requests_create_one_sample(sqlite_url):
    store = Store(sqlite_url)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints)
        with serve_gateway(store, config, endpoints, settings=GatewaySettings(end_on_answer=False)) as gw:

            async def main() -> list[int]:
                async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
                    rs = await asyncio.gather(*(http.post("/v1/chat/completions", json={
                        "model": MODEL, "max_tokens": 2, "user": "same",
                        "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(5)))
                return [r.status_code for r in rs]

            assert asyncio.run(main()) == [200] * 5
            batch_id = gw.batch_id
    (sample,) = store.samples(batch_id)
    assert sample.steps_done == 5
    assert sorted(s.index for s in store.steps(batch_id)) == [0, 1, 2, 3, 4]
