"""The OpenAI-compatible client against a real HTTP server (the real-time simulated engine)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from agentbatch.db.store import Store
from agentbatch.engines.openai_http import OpenAIEngine, load_endpoints
from agentbatch.engines.sim_server import running_sim_server
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig
from agentbatch.protocols.engine import ChatRequest, EngineFailure
from agentbatch.protocols.tokens import chat_tokens

LONG = "You are a careful assistant. " * 80


@pytest.fixture(scope="module")
def sim_url():
    with running_sim_server("tiny-cpu", time_scale=0.05) as url:
        yield url


def test_completion_usage_and_prefix_cache(sim_url: str) -> None:
    async def scenario():
        engine = OpenAIEngine("w0", sim_url, "tiny-cpu")
        messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "first question"}]
        first = await engine.complete(ChatRequest(messages, [], max_tokens=17, ignore_eos=True, priority=3))
        messages2 = messages + [first.message, {"role": "user", "content": "second question"}]
        second = await engine.complete(ChatRequest(messages2, [], max_tokens=5, ignore_eos=True, priority=0))
        await engine.aclose()
        return messages, first, second

    messages, first, second = asyncio.run(scenario())
    assert first.message["role"] == "assistant" and first.message["content"]
    assert first.output_tokens == 17 and second.output_tokens == 5  # forced lengths
    assert first.prompt_tokens == len(chat_tokens(messages, []))
    assert second.cached_prompt_tokens and second.cached_prompt_tokens > 0.5 * first.prompt_tokens
    assert first.latency_s > 0 and first.worker == "w0"


def test_payload_passes_vllm_extensions() -> None:
    engine = OpenAIEngine("w", "http://127.0.0.1:9/v1", "m")
    body = engine.payload(ChatRequest([{"role": "user", "content": "x"}], [{"type": "function"}],
                                      priority=-2, max_tokens=9, ignore_eos=True))
    assert body["priority"] == -2 and body["max_tokens"] == 9 and body["ignore_eos"] is True
    assert body["tools"] == [{"type": "function"}]
    assert "priority" not in engine.payload(ChatRequest([{"role": "user", "content": "x"}], []))
    asyncio.run(engine.aclose())


def test_unreachable_endpoint_is_a_retryable_engine_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed

    async def call():
        engine = OpenAIEngine("w", f"http://127.0.0.1:{port}/v1", "m", timeout_s=2)
        try:
            await engine.complete(ChatRequest([{"role": "user", "content": "x"}], []))
        finally:
            await engine.aclose()

    with pytest.raises(EngineFailure):
        asyncio.run(call())


def test_endpoints_validation(tmp_path) -> None:
    with pytest.raises(ValueError, match="endpoints"):
        load_endpoints([])
    with pytest.raises(ValueError, match=r"endpoints\[0\]"):
        load_endpoints([{"model": "m"}])
    f = tmp_path / "endpoints.yaml"
    f.write_text("endpoints:\n- {name: a, base_url: 'http://x/v1', model: m}\n")
    assert load_endpoints(str(f))[0]["name"] == "a"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_flow_over_http_records_workers_and_tokens(sim_url: str, sqlite_url: str) -> None:
    """A live batch through the flow with the HTTP engine: the model's text (no tool calls) ends each
    turn, so the checker fails the samples, but every step is recorded with its worker and tokens."""
    store = Store(sqlite_url)
    cfg = BatchConfig.model_validate({
        "workload": {"kind": "bfcl", "params": {"limit": 3, "seed": 2}},
        "engine": {"kind": "openai", "params": {"endpoints": [{"name": "sim-a", "base_url": sim_url,
                                                               "model": "tiny-cpu"}]}},
        "scheduling": {"max_active_samples": 3, "env_slots": 2, "priority": {"name": "chain_progress"}},
    })
    batch_id = create_batch(cfg, store)
    run_flow(store, batch_id, show_progress=False)
    samples = store.samples(batch_id)
    assert all(s.status == "completed" and s.score == 0.0 for s in samples)
    inference = [s for s in store.steps(batch_id) if s.kind == "inference"]
    assert inference and all(s.worker == "sim-a" and s.prompt_tokens and s.output_tokens for s in inference)
    store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_flow_scrapes_worker_metrics_into_the_store(sim_url: str, sqlite_url: str) -> None:
    """A batch against an HTTP worker records the worker's /metrics (vLLM names) in the store."""
    from agentbatch.db.metrics_models import WorkerMetricSample

    store = Store(sqlite_url)
    cfg = BatchConfig.model_validate({
        "workload": {"kind": "bfcl", "params": {"limit": 2, "seed": 9}},
        "engine": {"kind": "openai", "params": {"endpoints": [{"name": "sim-m", "base_url": sim_url,
                                                               "model": "tiny-cpu"}]}},
    })
    batch_id = create_batch(cfg, store)
    run_flow(store, batch_id, show_progress=False)
    with store.session() as s:
        rows = s.query(WorkerMetricSample).filter_by(batch_id=batch_id).all()
        from agentbatch.db.models import Worker

        worker = s.query(Worker).filter_by(batch_id=batch_id, name="sim-m").one()
    assert rows and all(r.worker == "sim-m" for r in rows)
    assert worker.metrics and worker.endpoint == sim_url
    store.close()
