"""Scrape vLLM workers' Prometheus `/metrics`: real cache hits and load for routing and reports.

`scrape(client, url)` reads one worker once; `MetricsScraper` polls many workers in the
background of a batch, keeps the latest values per worker (the trajectory-aware router reads
them through `fill_load`) and records snapshots in the store (latest in `workers.metrics`, a time
series in `worker_metrics`).

Counters (`*_total`) are cumulative since the worker started: hit rates over a batch are
differences between two snapshots (`WorkerMetrics.delta`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from agentbatch.scheduling.types import WorkerLoad

if TYPE_CHECKING:  # annotations only: the store module is imported where a scraper records
    from agentbatch.db.store import Store

log = logging.getLogger(__name__)

# The metric names vLLM (v1 engine) exports that agentbatch uses.
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # prompt tokens looked up in the prefix cache
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # of those, tokens found (multiples of the block size)
KV_USAGE = "vllm:kv_cache_usage_perc"  # 0..1 despite the name
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_CONFIG = "vllm:cache_config_info"  # an info gauge: the cache settings are its labels
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RECOMPUTED_TOKENS = "agentbatch:recomputed_tokens_total"  # serve-sim only; vLLM exports none

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition format -> {sample name: [(labels, value), ...]}.

    Small on purpose (no dependency): comments and TYPE/HELP lines are skipped, label values
    are unescaped, `NaN`/`+Inf` parse as floats.
    """
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels: dict[str, str] = {}
        if m["labels"]:
            for lm in _LABEL.finditer(m["labels"]):
                labels[lm[1]] = lm[2].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        try:
            value = float(m["value"])
        except ValueError:
            continue
        out.setdefault(m["name"], []).append((labels, value))
    return out


def _sum(samples: Samples, name: str) -> float:
    # One series per engine core (data parallel) and model: a worker's total is their sum.
    return sum(v for _, v in samples.get(name, []) if not math.isnan(v))


def _mean(samples: Samples, name: str) -> float | None:
    vals = [v for _, v in samples.get(name, []) if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else None


@dataclass(slots=True)
class WorkerMetrics:
    """One snapshot of one worker's metrics (counters cumulative since the worker started)."""

    name: str
    url: str
    scraped_at: float
    ok: bool = True
    error: str | None = None
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    kv_cache_usage: float | None = None
    running: int = 0
    waiting: int = 0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    recomputed_tokens: float | None = None  # None: the worker does not export it (vLLM)
    cache_config: dict[str, str] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None

    @property
    def block_size(self) -> int | None:
        try:
            return int(self.cache_config["block_size"])
        except (KeyError, ValueError):
            return None

    def delta(self, earlier: WorkerMetrics) -> WorkerMetrics:
        """Counters since `earlier` (gauges as now): what one batch did on a shared worker."""
        return WorkerMetrics(
            name=self.name, url=self.url, scraped_at=self.scraped_at, ok=self.ok, error=self.error,
            prefix_cache_queries=self.prefix_cache_queries - earlier.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits - earlier.prefix_cache_hits,
            kv_cache_usage=self.kv_cache_usage, running=self.running, waiting=self.waiting,
            preemptions=self.preemptions - earlier.preemptions,
            prompt_tokens=self.prompt_tokens - earlier.prompt_tokens,
            generation_tokens=self.generation_tokens - earlier.generation_tokens,
            recomputed_tokens=None if self.recomputed_tokens is None or earlier.recomputed_tokens is None
            else self.recomputed_tokens - earlier.recomputed_tokens,
            cache_config=dict(self.cache_config),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


def metrics_from_text(name: str, url: str, text: str, scraped_at: float | None = None) -> WorkerMetrics:
    s = parse_prometheus(text)
    info = s.get(CACHE_CONFIG, [])
    return WorkerMetrics(
        name=name, url=url, scraped_at=time.time() if scraped_at is None else scraped_at,
        prefix_cache_queries=_sum(s, PREFIX_QUERIES), prefix_cache_hits=_sum(s, PREFIX_HITS),
        kv_cache_usage=_mean(s, KV_USAGE), running=int(_sum(s, RUNNING)), waiting=int(_sum(s, WAITING)),
        preemptions=_sum(s, PREEMPTIONS), prompt_tokens=_sum(s, PROMPT_TOKENS),
        generation_tokens=_sum(s, GENERATION_TOKENS),
        recomputed_tokens=_sum(s, RECOMPUTED_TOKENS) if RECOMPUTED_TOKENS in s else None,
        cache_config={k: v for k, v in info[0][0].items() if k not in ("engine", "model_name")} if info else {},
    )


def metrics_url(base_url: str) -> str:
    """`/metrics` lives at the server root, beside `/v1`: accept either form of the endpoint URL."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


async def scrape(client: httpx.AsyncClient, name: str, base_url: str, timeout_s: float = 5.0) -> WorkerMetrics:
    """One scrape; a worker that does not answer gives `ok=False` with the error, never raises."""
    try:
        resp = await client.get(metrics_url(base_url), timeout=timeout_s)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        return WorkerMetrics(name=name, url=base_url, scraped_at=time.time(), ok=False,
                             error=f"{type(exc).__name__}: {exc}")
    return metrics_from_text(name, base_url, resp.text)


def fill_load(load: WorkerLoad, metrics: WorkerMetrics | None) -> WorkerLoad:
    """Put a worker's real load into the router's view of it.

    `kv_usage` comes straight from vLLM. The router's own `queued` counts requests it holds back;
    vLLM's `waiting` counts requests sent but not yet scheduled: they overlap (both may be in
    `in_flight`), so the larger of the two is the honest queue length.
    """
    if metrics is not None and metrics.ok:
        load.kv_usage = metrics.kv_cache_usage
        load.queued = max(load.queued, metrics.waiting)
    return load


def engine_endpoints(engines: Iterable[Any]) -> dict[str, str]:
    """{worker name: base URL} of the engines that talk to an HTTP server (openai, or replay over
    openai); simulated and scripted engines have none and are left out."""
    out: dict[str, str] = {}
    for e in engines:
        url = getattr(e, "base_url", None) or getattr(getattr(e, "inner", None), "base_url", None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            out[e.name] = url
    return out


class MetricsScraper:
    """Poll workers' `/metrics` every `interval_s` in the background; keep and record the latest.

    Use as `async with MetricsScraper({"w0": url}, store=store, batch_id=b) as scraper: ...`;
    `scraper.latest[name]` is the newest snapshot, `scraper.baseline[name]` the first one (for
    per-batch deltas). With a store, each round upserts `workers.metrics` and appends rows to the
    `worker_metrics` time series (when that table exists).
    """

    def __init__(
        self,
        endpoints: Mapping[str, str],
        *,
        interval_s: float = 2.0,
        store: Store | None = None,
        batch_id: int | None = None,
        timeout_s: float = 5.0,
        record_series: bool = True,
    ) -> None:
        self.endpoints = dict(endpoints)
        self.interval_s = interval_s
        self.store = store
        self.batch_id = batch_id
        self.timeout_s = timeout_s
        self.record_series = record_series
        self.latest: dict[str, WorkerMetrics] = {}
        self.baseline: dict[str, WorkerMetrics] = {}
        self.rounds = 0
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._recording: asyncio.Future[None] | None = None  # the last round's store write

    def _new_client(self) -> httpx.AsyncClient:
        # A TLS context only for https endpoints: loading the CA bundle costs ~40 ms of CPU a client.
        return httpx.AsyncClient(verify=any(u.startswith("https:") for u in self.endpoints.values()))

    async def scrape_once(self) -> dict[str, WorkerMetrics]:
        client = self._client or self._new_client()
        try:
            snaps = await asyncio.gather(
                *(scrape(client, n, u, self.timeout_s) for n, u in self.endpoints.items())
            )
        finally:
            if client is not self._client:
                await client.aclose()
        for m in snaps:
            if m.ok:
                self.baseline.setdefault(m.name, m)
            self.latest[m.name] = m
        self.rounds += 1
        if self.store is not None and self.batch_id is not None:
            # The store is synchronous: keep its I/O off the event loop. Shielded: stopping the loop
            # cannot cut a write short, and `stop` waits for it before the final round writes.
            self._recording = asyncio.ensure_future(asyncio.to_thread(self._record, self.store, self.batch_id, snaps))
            await asyncio.shield(self._recording)
        return {m.name: m for m in snaps}

    def _record(self, store: Store, batch_id: int, snaps: Iterable[WorkerMetrics]) -> None:
        from agentbatch.db.metrics_models import insert_worker_metrics

        snaps = list(snaps)
        for m in snaps:
            data = m.to_dict()
            if m.name in self.baseline:
                data["batch_delta"] = self.latest[m.name].delta(self.baseline[m.name]).to_dict()
            store.upsert_worker(batch_id, m.name, "engine", endpoint=m.url, metrics=data)
        if self.record_series:
            insert_worker_metrics(store, batch_id, [m for m in snaps if m.ok])

    def fill_loads(self, loads: Iterable[WorkerLoad]) -> list[WorkerLoad]:
        return [fill_load(w, self.latest.get(w.name)) for w in loads]

    async def _loop(self) -> None:
        while True:
            try:
                await self.scrape_once()
            except Exception:  # a store hiccup must not kill the scraper (nor the batch)
                log.exception("metrics scrape failed")
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        if self._task is None:
            self._client = self._new_client()
            self._task = asyncio.create_task(self._loop(), name="vllm-metrics-scraper")

    async def stop(self) -> None:
        """Stop polling, after one last scrape so the store holds the batch's final counters."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            if self._recording is not None and not self._recording.done():  # stopped while writing
                try:
                    await self._recording  # lands before the final round's write, never after it
                except Exception:
                    log.exception("metrics write failed")
            try:
                await self.scrape_once()
            except Exception:
                log.exception("final metrics scrape failed")
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
