"""A Prefect server that refuses the sample chains' task runs must not fail the samples.

Prefect can refuse to start a task run (a busy server answers 503 to the calls made before the run's
body; on a loaded 2-core machine this once failed every sample of a 200-sample lean batch). Here a real
server refuses for certain: the chains' task runs are tagged with the store's tag (agentbatch itself
leaves task runs untagged) and that tag has a concurrency limit of 0. The chains then run without their
Prefect task run, every sample completes, and the batch says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prefect.client.orchestration import get_client

from agentbatch.dashboards.artifacts import store_tag
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig

pytestmark = [pytest.mark.slow]


@pytest.fixture
def refusing_store(prefect_api: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store whose batches' task runs the Prefect server refuses (tag limit 0 on the store tag)."""
    from prefect import tags

    tag = f"store-{store_tag(sqlite_url)}"
    monkeypatch.setattr("agentbatch.flows.batch.untagged_task_runs", lambda: tags(tag))  # tag the task runs

    async def limit(value: int | None) -> None:
        async with get_client() as client:
            if value is None:
                await client.delete_concurrency_limit_by_tag(tag)
            else:
                await client.create_concurrency_limit(tag=tag, concurrency_limit=value)

    asyncio.run(limit(0))
    store = Store(sqlite_url)
    try:
        yield store
    finally:
        store.close()
        asyncio.run(limit(None))


@pytest.mark.parametrize("mode", ["chains", "steps"])  # lean runs no task runs
def test_refused_task_runs_do_not_fail_samples(refusing_store: Store, mode: str) -> None:
    config = BatchConfig.model_validate({
        "name": f"refused-{mode}",
        "workload": {"kind": "bfcl", "params": {"limit": 4, "seed": 2}},
        "engine": {"kind": "scripted", "params": {"workers": 1, "timing": {"kind": "token", "scale": 0}}},
        "scheduling": {"max_active_samples": 2, "env_slots": 1, "per_worker_inflight": 2},
        "execution": {"mode": mode},
    })
    batch_id = create_batch(config, refusing_store)
    outcome = run_flow(refusing_store, batch_id, show_progress=False)
    samples = refusing_store.samples(batch_id)
    assert outcome.failed == 0 and outcome.completed == 4
    assert all(s.status == "completed" and s.score == 1.0 for s in samples), [(s.index, s.error) for s in samples]
    steps = [st for st in refusing_store.steps(batch_id) if st.status == "completed"]
    assert steps and all(st.task_run_id is None for st in steps)  # they ran outside any task run
    assert refusing_store.get_batch(batch_id).status == "completed"
