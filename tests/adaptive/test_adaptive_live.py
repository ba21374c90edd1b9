"""Live: the controller reads the workers' real /metrics (a real-time simulated engine over HTTP)."""

from __future__ import annotations

import asyncio

import httpx

from agentbatch.engines.metrics import MetricsScraper
from agentbatch.engines.sim_server import running_sim_server
from agentbatch.scheduling.policies import AdmissionLimits
from agentbatch.scheduling.registry import PolicySpec, build_core
from agentbatch.tasks.coordinator import Coordinator, counters_from_workers


async def _scrape_after_two_calls(url: str) -> MetricsScraper:
    scraper = MetricsScraper({"sim-0": url}, record_series=False)
    messages = [{"role": "system", "content": "You are a careful agent. " * 40}, {"role": "user", "content": "go"}]
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(2):  # the second call hits the first one's prefix
            r = await client.post(f"{url}/chat/completions", json={"messages": messages,
                                                                    "max_tokens": 4})  # fmt: skip
            r.raise_for_status()
    await scraper.scrape_once()
    return scraper


def test_live_core_reads_engine_counters_from_metrics() -> None:
    with running_sim_server("tiny-cpu", worker_name="sim-0") as url:
        scraper = asyncio.run(_scrape_after_two_calls(url))
    counters = counters_from_workers(scraper.latest.values())
    assert counters.prompt_tokens > 0 and 0 < counters.cached_tokens < counters.prompt_tokens
    assert counters.recomputed_tokens == 0.0  # serve-sim exports it, as the engine model has it in virtual time
    core = build_core(AdmissionLimits(max_active_samples=4, env_slots=2), ["sim-0"],
                      env_queue=PolicySpec("caas"), inference_queue=PolicySpec("fifo"),
                      router=PolicySpec("trajectory_aware"), priority=PolicySpec("chain_progress"))  # fmt: skip
    coord = Coordinator(core)
    coord.engine_counters = lambda: counters_from_workers(scraper.latest.values())
    assert core.controller is not None
    assert core.admission_signals().engine == counters


def test_a_worker_without_the_recompute_counter_leaves_it_unmeasured() -> None:
    from agentbatch.engines.metrics import metrics_from_text

    vllm = 'vllm:prompt_tokens_total{engine="0"} 10.0\nvllm:num_preemptions_total{engine="0"} 1.0\n'
    sim = vllm + 'agentbatch:recomputed_tokens_total{engine="0"} 7.0\n'
    assert metrics_from_text("v", "u", vllm).recomputed_tokens is None  # vLLM: no such counter
    assert metrics_from_text("s", "u", sim).recomputed_tokens == 7.0
    both = counters_from_workers([metrics_from_text("v", "u", vllm), metrics_from_text("s", "u", sim)])
    assert both.recomputed_tokens is None  # a sum over some workers would understate it
    assert counters_from_workers([metrics_from_text("s", "u", sim)] * 2).recomputed_tokens == 14.0
