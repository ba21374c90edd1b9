"""What the batch had to work with: engine workers, requests per worker, environment slots.

Read from the batch's stored config (agentbatch.flows.config.BatchConfig as a dict); where the
config does not say, from what the steps show (documented in docs/dashboards.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentbatch.dashboards.frames import BatchData
from agentbatch.dashboards.timeline import occupancy, peak

# The BatchConfig defaults, used when an older or foreign config lacks the field.
DEFAULT_ENV_SLOTS = 8
DEFAULT_PER_WORKER_INFLIGHT = 16


@dataclass(frozen=True)
class Capacity:
    engine_workers: int
    per_worker_inflight: int
    env_slots: int
    source: str  # where the numbers came from, for the report


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, (list, tuple)) and value:
        return len(value)
    return None


def batch_capacity(data: BatchData) -> Capacity:
    sched = data.config.get("scheduling") or {}
    engine_params = (data.config.get("engine") or {}).get("params") or {}
    notes = []
    env_slots = _positive_int(sched.get("env_slots"))
    if env_slots is None:
        env = data.steps[data.steps["kind"] == "environment"]
        env_slots = max(peak(occupancy(env["started_at"], env["finished_at"])), 1) if not env.empty \
            else DEFAULT_ENV_SLOTS
        notes.append("env_slots: peak observed")
    per_worker = _positive_int(sched.get("per_worker_inflight"))
    if per_worker is None:
        per_worker = DEFAULT_PER_WORKER_INFLIGHT
        notes.append("per_worker_inflight: default")
    # Workers that actually served inference steps; else the store's worker rows; else the config.
    seen = data.steps.loc[data.steps["kind"] == "inference", "worker"].dropna().unique()
    registered = data.workers.loc[data.workers["kind"] == "engine", "name"].unique() \
        if not data.workers.empty else []
    workers = max(len(seen), len(registered))
    if workers == 0:
        workers = _positive_int(engine_params.get("workers")) or 1
        notes.append("engine workers: config")
    return Capacity(workers, per_worker, env_slots, "; ".join(notes) or "config")
