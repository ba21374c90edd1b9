"""The batch flow: real Prefect task runs through the custom task runner, every step in the store."""

from __future__ import annotations

import pytest
from testkit import max_overlap

from agentbatch.db.models import Sample, Step
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig

pytestmark = pytest.mark.usefixtures("prefect_api")

LIMITS = {"max_active_samples": 5, "env_slots": 2, "per_worker_inflight": 2}


def config(mode: str = "steps", limit: int = 10, **scheduling) -> BatchConfig:
    return BatchConfig.model_validate({
        "name": f"test-{mode}",
        "workload": {"kind": "bfcl", "params": {"limit": limit, "seed": 3}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0.2}}},
        "scheduling": {**LIMITS, **scheduling},
        "execution": {"mode": mode},
    })


def count_task_runs(flow_run_id: str) -> int:
    """Task runs the Prefect server recorded under a flow run."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read() -> int:
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return len(runs)

    return asyncio.run(read())


def check_batch(store: Store, batch_id: int) -> tuple[list[Sample], list[Step]]:
    samples = store.samples(batch_id)
    steps = store.steps(batch_id)
    assert all(s.status == "completed" and s.score == 1.0 for s in samples), [(s.task_id, s.error) for s in samples]
    for s in samples:
        mine = [st for st in steps if st.sample_id == s.id]
        assert [st.index for st in mine] == list(range(len(mine)))  # one attempt each, no gaps
        assert [st.kind for st in mine] == ["inference" if i % 2 == 0 else "environment" for i in range(len(mine))]
        assert s.steps_done == len(mine)
    # the limits hold in the recorded timings (a step is recorded inside its slot)
    env = [(st.started_at, st.finished_at) for st in steps if st.kind == "environment"]
    assert max_overlap(env) <= LIMITS["env_slots"]
    for worker in {st.worker for st in steps if st.kind == "inference"}:
        inf = [(st.started_at, st.finished_at) for st in steps if st.kind == "inference" and st.worker == worker]
        assert max_overlap(inf) <= LIMITS["per_worker_inflight"]
    assert max_overlap([(s.admitted_at, s.finished_at) for s in samples]) <= LIMITS["max_active_samples"]
    return samples, steps


@pytest.mark.slow
def test_steps_mode_runs_each_step_as_a_prefect_task(db_url: str) -> None:
    store = Store(db_url)
    batch_id = create_batch(config("steps"), store)
    outcome = run_flow(store, batch_id, show_progress=False)
    samples, steps = check_batch(store, batch_id)
    assert outcome.completed == len(samples) == 10
    assert all(st.task_run_id for st in steps)  # every step ran inside a Prefect task run
    assert len({st.task_run_id for st in steps}) == len(steps)
    assert outcome.peaks["environment"] <= LIMITS["env_slots"]
    assert store.get_batch(batch_id).status == "completed"
    assert store.get_batch(batch_id).flow_run_id
    store.close()


@pytest.mark.slow
def test_lean_mode_runs_no_prefect_task_runs(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    batch_id = create_batch(config("lean"), store)
    run_flow(store, batch_id, show_progress=False)
    _, steps = check_batch(store, batch_id)
    assert all(st.task_run_id is None for st in steps)
    flow_run_id = store.get_batch(batch_id).flow_run_id
    assert flow_run_id  # the batch is still a Prefect flow run ...
    assert count_task_runs(flow_run_id) == 0  # ... with nothing per sample or step
    store.close()


@pytest.mark.slow
def test_coupled_baseline_limits_active_samples(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    batch_id = create_batch(config("steps", limit=6, coupled=True), store)
    outcome = run_flow(store, batch_id, show_progress=False)
    samples, _ = check_batch(store, batch_id)
    assert outcome.peaks["admission"] <= LIMITS["env_slots"]
    assert max_overlap([(s.admitted_at, s.finished_at) for s in samples]) <= LIMITS["env_slots"]
    store.close()
