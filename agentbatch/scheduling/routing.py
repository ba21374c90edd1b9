"""Routers across engine workers: least-loaded and trajectory-aware (prefix-affine, bounded load).

Routers only see `WorkerLoad` views. The live runner fills them from its own bookkeeping or from a
real vLLM's `/metrics` (`num_requests_running` -> in_flight, `num_requests_waiting` -> queued,
`kv_cache_usage_perc` -> kv_usage); the virtual-time simulation fills them from its engine models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentbatch.scheduling.policies import Router
from agentbatch.scheduling.types import StepTicket, WorkerLoad


def least_loaded(workers: Sequence[WorkerLoad]) -> WorkerLoad:
    """The worker with the smallest load/capacity (a bigger worker takes proportionally more); ties
    by KV usage where known, then list order. Inlined: it runs once per inference call."""
    best = workers[0]
    best_load = (best.in_flight + best.queued) / (best.capacity or 1)
    best_kv = best.kv_usage or 0.0
    for w in workers[1:]:
        load = (w.in_flight + w.queued) / (w.capacity or 1)
        if load < best_load or (load == best_load and (w.kv_usage or 0.0) < best_kv):
            best, best_load, best_kv = w, load, w.kv_usage or 0.0
    return best


class LeastLoadedRouter(Router):
    """Each call goes to the least-loaded worker (no cache affinity)."""

    def route(self, ticket: StepTicket, workers: Sequence[WorkerLoad]) -> str:
        return least_loaded(workers).name


@dataclass(slots=True)
class RoutingCounters:
    first: int = 0  # calls of samples without a previous worker
    sticky: int = 0  # calls sent back to the worker holding the sample's prefix
    moved: int = 0  # calls moved away from that worker because it was overloaded (recompute accepted)

    @property
    def sticky_share(self) -> float:
        """Share of repeat calls that stayed on their worker."""
        repeat = self.sticky + self.moved
        return self.sticky / repeat if repeat else 1.0


class TrajectoryAwareRouter(Router):
    """Send a sample back to the worker that holds its prefix unless that worker is overloaded.

    The home worker is the one that served the sample's last call (learnt through
    `on_request_complete`, or `SampleProgress.last_worker` for a resumed sample), else any worker
    listing the sample in `cached_samples`. It is overloaded, as in SGLang's cache_aware router, when both
      load(home) - load(least) > balance_abs   and   load(home) > balance_rel * load(least)
    (loads in requests, in flight + queued). With `kv_margin` set and KV usage known for both (from
    /metrics), a home whose KV usage exceeds the least-loaded worker's by more than kv_margin also
    counts as overloaded: moving there costs a recompute but avoids evicting others' prefixes.
    Moves are counted in `counters`.
    """

    def __init__(self, balance_abs: int = 64, balance_rel: float = 1.5, kv_margin: float | None = None) -> None:
        if balance_abs < 0 or balance_rel < 1.0:
            raise ValueError("balance_abs must be >= 0 and balance_rel >= 1")
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.kv_margin = kv_margin
        self.counters = RoutingCounters()
        self._homes: dict[int, str] = {}  # sample id -> worker that served its last call

    @property
    def wants_kv_usage(self) -> bool:  # type: ignore[override]  # Router's class default, computed here
        return self.kv_margin is not None

    def on_request_complete(self, sample_id: int, worker: str) -> None:
        self._homes[sample_id] = worker

    def on_sample_finished(self, sample_id: int) -> None:
        self._homes.pop(sample_id, None)

    def decision_counts(self) -> dict[str, int]:
        c = self.counters
        return {"first": c.first, "sticky": c.sticky, "moved": c.moved}

    def _home(self, ticket: StepTicket, workers: Sequence[WorkerLoad]) -> WorkerLoad | None:
        sid = ticket.sample.sample_id
        last = self._homes.get(sid, ticket.sample.last_worker)
        fallback = None
        for w in workers:
            if w.name == last:
                return w
            if fallback is None and sid in w.cached_samples:
                fallback = w
        return fallback

    def overloaded(self, home: WorkerLoad, least: WorkerLoad) -> bool:
        if home is least:
            return False
        gap = home.load - least.load
        if gap > self.balance_abs and home.load > self.balance_rel * least.load:
            return True
        if self.kv_margin is not None and home.kv_usage is not None and least.kv_usage is not None:
            return home.kv_usage - least.kv_usage > self.kv_margin
        return False

    def route(self, ticket: StepTicket, workers: Sequence[WorkerLoad]) -> str:
        least = least_loaded(workers)
        home = self._home(ticket, workers)
        if home is None:
            self.counters.first += 1
            return least.name
        if self.overloaded(home, least):
            self.counters.moved += 1
            return least.name
        self.counters.sticky += 1
        return home.name
