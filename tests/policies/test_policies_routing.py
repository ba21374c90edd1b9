"""Routers and the chain-progress priority on hand-made cases."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.priority import ChainProgressPriority
from agentbatch.scheduling.registry import make_priority, make_router
from agentbatch.scheduling.routing import LeastLoadedRouter, TrajectoryAwareRouter
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad


def ticket(sid: int = 1, last: str | None = None) -> StepTicket:
    s = SampleProgress(sample_id=sid, task_id="t", arrival_seq=sid, last_worker=last)
    return StepTicket(sample=s, kind=StepKind.INFERENCE, step_index=2, enqueued_at=0.0)


def workers(*loads: int, capacity: int = 256, kv: tuple[float | None, ...] | None = None) -> list[WorkerLoad]:
    kv = kv or (None,) * len(loads)
    return [WorkerLoad(name=f"w{i}", in_flight=n, capacity=capacity, kv_usage=k)
            for i, (n, k) in enumerate(zip(loads, kv, strict=True))]


def test_least_loaded_by_relative_load_then_kv_then_order() -> None:
    r = LeastLoadedRouter()
    assert r.route(ticket(), workers(5, 2, 7)) == "w1"
    assert r.route(ticket(), workers(3, 3)) == "w0"
    assert r.route(ticket(), workers(3, 3, kv=(0.8, 0.2))) == "w1"
    big = [WorkerLoad("small", in_flight=4, capacity=8), WorkerLoad("big", in_flight=6, capacity=32)]
    assert r.route(ticket(), big) == "big"  # 6/32 < 4/8


def test_trajectory_aware_sticks_within_the_margin() -> None:
    r = TrajectoryAwareRouter(balance_abs=64, balance_rel=1.5)
    assert r.route(ticket(last="w1"), workers(0, 60)) == "w1"  # gap 60 <= 64: stay
    assert r.route(ticket(last="w1"), workers(150, 200)) == "w1"  # gap 50: stay
    assert r.counters.sticky == 2 and r.counters.moved == 0


def test_trajectory_aware_moves_when_both_margins_are_exceeded() -> None:
    r = TrajectoryAwareRouter(balance_abs=64, balance_rel=1.5)
    assert r.route(ticket(last="w1"), workers(10, 100)) == "w0"  # gap 90 > 64 and 100 > 15
    assert r.counters.moved == 1
    r = TrajectoryAwareRouter(balance_abs=32, balance_rel=1.5)
    assert r.route(ticket(last="w1"), workers(160, 200)) == "w1"  # gap 40 > 32 but 200 < 1.5 x 160
    assert r.counters.sticky_share == 1.0


def test_trajectory_aware_first_call_goes_least_loaded_and_uses_cached_samples() -> None:
    r = TrajectoryAwareRouter()
    assert r.route(ticket(sid=7), workers(4, 1)) == "w1"
    assert r.counters.first == 1
    ws = workers(0, 3)
    ws[1].cached_samples = {7}
    assert r.route(ticket(sid=7), ws) == "w1"  # no last_worker, but w1 holds its prefix
    assert r.counters.sticky == 1


def test_trajectory_aware_with_metrics_kv_usage() -> None:
    # Loads and KV usage as read from vLLM /metrics (num_requests_running, kv_cache_usage_perc).
    r = TrajectoryAwareRouter(balance_abs=64, balance_rel=1.5, kv_margin=0.3)
    assert r.route(ticket(last="w0"), workers(10, 8, kv=(0.5, 0.4))) == "w0"
    assert r.route(ticket(last="w0"), workers(10, 8, kv=(0.95, 0.4))) == "w1"
    assert r.route(ticket(last="w0"), workers(10, 8, kv=(0.95, None))) == "w0"  # unknown KV: load rule only


def test_trajectory_aware_rejects_bad_margins() -> None:
    with pytest.raises(ValueError):
        TrajectoryAwareRouter(balance_rel=0.5)


def test_chain_progress_priority() -> None:
    p = ChainProgressPriority(ceiling=100)
    a = SampleProgress(1, "t", 0, steps_done=3)
    b = SampleProgress(2, "t", 1, steps_done=9)
    assert p.priority(b) < p.priority(a)  # more progress: served first (vLLM: lower first)
    assert p.priority(SampleProgress(3, "t", 2, steps_done=500)) == 0  # clipped, never negative
    h = ChainProgressPriority(ceiling=100, use_prior=True)
    long_chain = SampleProgress(4, "t", 3, steps_done=30, prior_chain_steps=40)
    short_chain = SampleProgress(5, "t", 4, steps_done=1, prior_chain_steps=12)
    assert h.priority(long_chain) == 60 and h.priority(short_chain) == 88  # longer expected chain first
    assert h.priority(a) == 97  # no prior: observed progress
    r = ChainProgressPriority(ceiling=100, use_prior=True, rank="remaining")
    assert r.priority(long_chain) == 90 and r.priority(short_chain) == 89  # 10 vs 11 steps left


def test_registry_names() -> None:
    assert isinstance(make_router("trajectory_aware", balance_abs=8), TrajectoryAwareRouter)
    assert isinstance(make_router("least_loaded"), LeastLoadedRouter)
    assert make_priority("chain_progress").priority(SampleProgress(1, "t", 0, steps_done=1)) == 999
