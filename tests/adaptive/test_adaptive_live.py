"""Live: the controller reads the workers' real /metrics (a real-time simulated engine over HTTP)."""

from __future__ import annotations

import asyncio

import httpx

from agentbatch.engines.metrics import MetricsScraper
from agentbatch.engines.sim_server import running_sim_server
from agentbatch.scheduling.policies import AdmissionLimits
from agentbatch.scheduling.registry import PolicyChoice, build_core
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
    assert counters.recomputed_tokens is None  # not a vLLM metric: preemptions and hit rate stand for it
    core = build_core(AdmissionLimits(max_active_samples=4, env_slots=2), ["sim-0"],
                      env_queue=PolicyChoice("caas"), inference_queue=PolicyChoice("fifo"),
                      router=PolicyChoice("trajectory_aware"), priority=PolicyChoice("chain_progress"))  # fmt: skip
    coord = Coordinator.from_core(core)
    coord.engine_counters = lambda: counters_from_workers(scraper.latest.values())
    assert core.controller is not None
    assert core.admission_signals().engine == counters
