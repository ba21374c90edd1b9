"""The scheduling policies run live: a Prefect batch on two real-time simulated engine workers.

Trajectory-aware routing keeps a sample on the worker that holds its prefix (visible in the store
as the share of inference steps served by the sample's previous worker, and as prefix-cache hits),
round-robin does not; the environment-slot limit holds under CAAS either way.
"""

from __future__ import annotations

import pytest
from test_core_flow import max_overlap  # noqa: I001 - sibling test module

from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]
ENV_SLOTS = 2


def run(store: Store, router: str) -> int:
    cfg = BatchConfig.model_validate({
        "name": f"live-{router}",
        "workload": {"kind": "bfcl", "params": {"limit": 10, "seed": 21}},
        "engine": {"kind": "scripted", "params": {
            "workers": 2, "timing": {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 1.0}}},
        "scheduling": {"max_active_samples": 8, "env_slots": ENV_SLOTS, "per_worker_inflight": 8,
                       "router": {"name": router}, "env_queue": {"name": "caas"},
                       "priority": {"name": "chain_progress"}},
    })
    batch_id = create_batch(cfg, store)
    run_flow(store, batch_id, show_progress=False)
    return batch_id


def sticky_share(store: Store, batch_id: int) -> float:
    same = moves = 0
    steps = [s for s in store.steps(batch_id) if s.kind == "inference" and s.status == "completed"]
    by_sample: dict[int, list] = {}
    for s in sorted(steps, key=lambda s: s.index):
        by_sample.setdefault(s.sample_id, []).append(s.worker)
    for workers in by_sample.values():
        for prev, cur in zip(workers, workers[1:], strict=False):
            same += prev == cur
            moves += prev != cur
    return same / (same + moves)


def cache_hit_rate(store: Store, batch_id: int) -> float:
    steps = [s for s in store.steps(batch_id) if s.kind == "inference" and s.status == "completed"]
    return sum(s.cached_prompt_tokens or 0 for s in steps) / sum(s.prompt_tokens or 0 for s in steps)


def test_sticky_routing_and_env_limit_live(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    sticky, rr = run(store, "trajectory_aware"), run(store, "round_robin")
    for batch_id in (sticky, rr):
        assert all(s.score == 1.0 for s in store.samples(batch_id))
        env = [(s.started_at, s.finished_at) for s in store.steps(batch_id) if s.kind == "environment"]
        assert max_overlap(env) <= ENV_SLOTS
    assert sticky_share(store, sticky) >= 0.9
    assert sticky_share(store, rr) <= 0.6
    # both workers share the tool-schema prefix of every task, so round-robin hits too, but less
    assert cache_hit_rate(store, sticky) > cache_hit_rate(store, rr)
    store.close()
