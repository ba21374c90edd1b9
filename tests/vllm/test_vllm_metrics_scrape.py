"""Parsing vLLM's /metrics, the router's load signal, and the scraper recording into the store."""

from __future__ import annotations

import asyncio
import time

import pytest
from vllm_helpers import fake_config

from agentbatch.db.metrics_models import worker_metrics
from agentbatch.db.models import Worker
from agentbatch.db.store import Store
from agentbatch.engines.metrics import (
    MetricsScraper,
    WorkerMetrics,
    fill_load,
    metrics_from_text,
    metrics_url,
    parse_prometheus,
)
from agentbatch.engines.vllm_workers import WorkerCluster
from agentbatch.scheduling.types import WorkerLoad

# Lines as vLLM 0.32 (CPU) prints them, after two requests sharing a 979-token prompt.
REAL = r"""
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.125
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1958.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7962234952777147e+09
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 896.0
vllm:num_preemptions_total{engine="0",model_name="tiny"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1958.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 16.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",kv_cache_layout="None",mamba_cache_mode="none",note="a \"quoted\", comma",num_gpu_blocks="16384"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 2.0
vllm:weird{engine="0"} NaN
"""


def test_parse_real_vllm_metrics():
    samples = parse_prometheus(REAL)
    assert samples["vllm:prefix_cache_hits_total"] == [({"engine": "0", "model_name": "tiny"}, 896.0)]
    assert samples["vllm:time_to_first_token_seconds_bucket"][0][0]["le"] == "+Inf"
    m = metrics_from_text("w0", "http://h:1/v1", REAL, scraped_at=5.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1958.0, 896.0)
    assert m.hit_rate == pytest.approx(896 / 1958)
    assert (m.running, m.waiting, m.kv_cache_usage, m.preemptions) == (1, 3, 0.125, 0.0)
    assert m.block_size == 128
    assert m.cache_config["note"] == 'a "quoted", comma' and "engine" not in m.cache_config
    assert (m.prompt_tokens, m.generation_tokens) == (1958.0, 16.0)


def test_counters_sum_over_engine_cores_and_delta():
    text = "\n".join([
        'vllm:prefix_cache_queries_total{engine="0"} 100', 'vllm:prefix_cache_queries_total{engine="1"} 300',
        'vllm:prefix_cache_hits_total{engine="0"} 50', 'vllm:prefix_cache_hits_total{engine="1"} 150',
        'vllm:kv_cache_usage_perc{engine="0"} 0.2', 'vllm:kv_cache_usage_perc{engine="1"} 0.4'])
    m = metrics_from_text("w", "u", text)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (400, 200)
    assert m.kv_cache_usage == pytest.approx(0.3)
    earlier = WorkerMetrics("w", "u", 0.0, prefix_cache_queries=100, prefix_cache_hits=20)
    d = m.delta(earlier)
    assert (d.prefix_cache_queries, d.prefix_cache_hits) == (300, 180)
    assert metrics_url("http://h:8000/v1") == metrics_url("http://h:8000/") == "http://h:8000/metrics"


def test_fill_load_takes_kv_usage_and_the_longer_queue():
    m = metrics_from_text("w0", "u", REAL)
    load = fill_load(WorkerLoad("w0", in_flight=4, queued=1), m)
    assert load.kv_usage == 0.125 and load.queued == 3
    assert fill_load(WorkerLoad("w0", queued=7), m).queued == 7
    down = WorkerMetrics("w0", "u", 0.0, ok=False, error="ConnectError")
    untouched = fill_load(WorkerLoad("w0", queued=2), down)
    assert untouched.kv_usage is None and untouched.queued == 2


def test_scraper_records_latest_and_series_in_the_store(store, tmp_path):
    batch_id = store.create_batch("metrics", {}, [("t0", {})])
    cluster = WorkerCluster(fake_config(tmp_path, count=2))
    cluster.up()
    try:
        endpoints = {e.name: e.base_url for e in cluster.endpoints}
        endpoints["gone"] = "http://127.0.0.1:9/v1"  # a dead worker must not break the others

        async def run() -> MetricsScraper:
            async with MetricsScraper(endpoints, interval_s=0.05, store=store, batch_id=batch_id) as s:
                while s.rounds < 3:
                    await asyncio.sleep(0.05)
            return s

        scraper = asyncio.run(run())
    finally:
        cluster.down()
    assert not scraper.latest["gone"].ok and "ConnectError" in scraper.latest["gone"].error
    w0 = scraper.latest["vllm-0"]
    assert w0.ok and w0.waiting == 5 and w0.kv_cache_usage == 0.25 and w0.block_size == 128
    assert w0.prefix_cache_hits > scraper.baseline["vllm-0"].prefix_cache_hits  # counters grew
    loads = scraper.fill_loads([WorkerLoad("vllm-0"), WorkerLoad("gone", queued=1)])
    assert loads[0].queued == 5 and loads[1].queued == 1

    series = worker_metrics(store, batch_id, "vllm-0")
    assert len(series) == scraper.rounds >= 4  # >= 3 rounds in the loop + the final one at stop
    hits = [r["prefix_cache_hits"] for r in series]
    assert hits == sorted(hits) and hits[-1] == w0.prefix_cache_hits
    assert {r["worker"] for r in worker_metrics(store, batch_id)} == {"vllm-0", "vllm-1"}
    with store.session() as s:
        rows = {w.name: w for w in s.query(Worker).filter_by(batch_id=batch_id)}
    assert rows["vllm-0"].kind == "engine" and rows["vllm-0"].endpoint == endpoints["vllm-0"]
    assert rows["vllm-0"].metrics["prefix_cache_hits"] == w0.prefix_cache_hits
    delta = rows["vllm-0"].metrics["batch_delta"]
    assert delta["prefix_cache_hits"] == w0.prefix_cache_hits - scraper.baseline["vllm-0"].prefix_cache_hits
    assert rows["gone"].metrics["ok"] is False


class SlowFirstWrite(MetricsScraper):
    """A scraper whose first store write takes a while (a lock held elsewhere, a loaded machine)."""

    def _record(self, store, batch_id, snaps):  # type: ignore[no-untyped-def]
        if self.rounds == 1:
            time.sleep(0.5)
        super()._record(store, batch_id, snaps)


def test_stopping_during_a_write_waits_for_it_before_the_final_round(sqlite_url, tmp_path):
    """Stopped while a round writes: that write lands, before the final round's (whose counters are
    the newest), so the store holds one row per round and the latest snapshot is the final one."""
    store = Store(sqlite_url)
    batch_id = store.create_batch("metrics", {}, [("t0", {})])
    cluster = WorkerCluster(fake_config(tmp_path, count=1))
    cluster.up()
    try:
        endpoints = {e.name: e.base_url for e in cluster.endpoints}

        async def run() -> MetricsScraper:
            async with SlowFirstWrite(endpoints, interval_s=0.05, store=store, batch_id=batch_id) as s:
                while s.rounds < 1:  # the first round is writing now
                    await asyncio.sleep(0.01)
            return s

        scraper = asyncio.run(run())
        series = worker_metrics(store, batch_id, "vllm-0")
        assert len(series) == scraper.rounds == 2
        assert series[-1]["prefix_cache_queries"] == scraper.latest["vllm-0"].prefix_cache_queries
        with store.session() as s:
            latest = s.query(Worker).filter_by(batch_id=batch_id, name="vllm-0").one().metrics
        assert latest["prefix_cache_queries"] == scraper.latest["vllm-0"].prefix_cache_queries
    finally:
        cluster.down()
        store.close()
