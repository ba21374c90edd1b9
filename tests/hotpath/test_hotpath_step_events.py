"""Chains mode (the default) against a real Prefect server: a task run per sample chain, and every
committed step listed in the batched `agentbatch.steps.completed` events of the flow run."""

from __future__ import annotations

import time

import httpx
import pytest

from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig
from agentbatch.tasks.step_events import EVENT

pytestmark = [pytest.mark.slow]


def flow_run_events(api: str, flow_run_id: str, expected_steps: int) -> list[dict]:
    """The step events related to the flow run, once the server has recorded all their steps."""
    body = {"filter": {"event": {"name": [EVENT]}, "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                       "occurred": {"since": "2020-01-01T00:00:00Z"}}, "limit": 50}
    deadline = time.time() + 90
    while True:
        events = httpx.post(f"{api}/events/filter", json=body, timeout=30).json()["events"]
        if sum(len(e["payload"]["steps"]) for e in events) >= expected_steps or time.time() > deadline:
            return events
        time.sleep(1)


def test_chains_mode_lists_every_step_in_prefect_events(prefect_api: str, sqlite_url: str) -> None:
    config = BatchConfig.model_validate({
        "name": "events",
        "workload": {"kind": "bfcl", "params": {"limit": 6, "seed": 3}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0.1}}},
        "scheduling": {"max_active_samples": 3, "env_slots": 2, "per_worker_inflight": 2},
    })
    assert config.execution.mode == "chains"  # the default
    store = Store(sqlite_url)
    batch_id = create_batch(config, store)
    outcome = run_flow(store, batch_id, show_progress=False)
    assert outcome.completed == 6
    steps = [st for st in store.steps(batch_id) if st.status == "completed"]
    by_sample = {}
    for st in steps:  # every step carries its sample chain's task run
        assert st.task_run_id
        by_sample.setdefault(st.sample_id, set()).add(st.task_run_id)
    assert all(len(ids) == 1 for ids in by_sample.values()) and len({i for ids in by_sample.values()
                                                                      for i in ids}) == 6

    events = flow_run_events(prefect_api, store.get_batch(batch_id).flow_run_id, len(steps))
    listed = [(s["sample_id"], s["index"]) for e in events for s in e["payload"]["steps"]]
    assert sorted(listed) == sorted((st.sample_id, st.index) for st in steps)  # each step once
    assert len(events) < len(steps) / 2  # batched: far fewer events than steps
    related = {r["prefect.resource.id"] for e in events for r in e["related"]}
    assert {f"prefect.task-run.{i}" for ids in by_sample.values() for i in ids} <= related
    store.close()
