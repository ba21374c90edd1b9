"""Scale-out workers of one batch: the `agentbatch-join` flow, and its deployment on a work pool.

A worker claims unfinished samples of a batch in chunks under sample leases (`db/leases.py`), runs
them, claims the next chunk, and ends once every sample is finished; several of them (on one machine
or many, over one PostgreSQL store) split a batch between them. Two ways to start workers:
- `agentbatch join BATCH_ID`: this process is one worker (one flow run of `join_flow`);
- `agentbatch join BATCH_ID --work-pool POOL --workers N`: `deploy_join` registers a deployment of
  `join_flow` (module entrypoint, so any machine with agentbatch installed loads it) on the work pool
  and creates N flow runs of it; `prefect worker start --pool POOL` on each machine runs them.

The store URL is a flow-run parameter, which the Prefect server keeps in plain text: it holds the
password as a reference (`${AGENTBATCH_SECRET_DB_URL_PASSWORD}`, `flows/store_url.py`) that each
worker resolves from its own environment, or from its AGENTBATCH_DB_URL when that names the same
database.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

from prefect import flow

from agentbatch.dashboards.artifacts import store_tag
from agentbatch.db.store import Store
from agentbatch.flows.batch import batch_workload, execute_batch
from agentbatch.flows.identity import batch_tags, flow_run_name
from agentbatch.flows.launch import apply_deployment
from agentbatch.flows.leased import BUSY
from agentbatch.flows.store_url import flow_param_url, url_from_param
from agentbatch.protocols.secrets import ENV_REF, install_log_redaction
from agentbatch.tasks.runner import CoordinatedTaskRunner

FLOW_NAME = "agentbatch-join"


def unfinished(store: Store, batch_id: int) -> int:
    counts = store.status_counts(batch_id)
    return counts.get("pending", 0) + counts.get("running", 0)


async def work(store: Store, batch_id: int, chunk: int, poll_s: float, show_progress: bool | str | None) -> dict[str, Any]:
    """Claim, run, repeat; wait while others hold the rest (their leases may still expire). The
    workload is built once for all the chunks this worker runs."""
    chunks = samples = 0
    workload = None
    try:
        while unfinished(store, batch_id):
            workload = workload or batch_workload(store, batch_id)
            outcome = await execute_batch(store, batch_id, workload=workload, show_progress=show_progress,
                                          claim_limit=chunk)
            if outcome.status == BUSY:
                await asyncio.sleep(poll_s)
                continue
            chunks += 1
            samples = outcome.samples
    finally:
        if workload is not None:
            await workload.aclose()
    counts = store.status_counts(batch_id)
    return {"chunks": chunks, "samples": samples, "failed": counts.get("failed", 0),
            "completed": counts.get("completed", 0)}


def worker_variables(stored_config: dict[str, Any], db_param: str) -> list[str]:
    """The environment variables a worker machine must set: the secret references of the batch's
    stored config (API keys...) and of the store URL parameter."""
    text = json.dumps(stored_config) + db_param
    return sorted(set(ENV_REF.findall(text)))


@flow(name=FLOW_NAME, task_runner=CoordinatedTaskRunner(), validate_parameters=False, persist_result=False,
      log_prints=False)
async def join_flow(batch_id: int, db_url: str, chunk: int, poll_s: float,
                    show_progress: bool | str | None = None) -> dict[str, Any]:
    """One worker of a batch: claim up to `chunk` unfinished samples, run them, repeat until the
    batch is finished (see the module doc)."""
    install_log_redaction()  # also where a work pool's worker runs it
    store = Store(url_from_param(db_url))
    try:
        return await work(store, batch_id, chunk, poll_s, show_progress)
    finally:
        store.close()


@dataclass
class JoinDeployment:
    """What `deploy_join` registers: the batch, its store and the pool whose workers run it."""

    batch_id: int
    batch_name: str
    db_url: str  # as this process opened it; stored without its password
    work_pool: str
    workers: int
    chunk: int
    poll_s: float

    @property
    def name(self) -> str:
        """`batch-<id>-<store tag>`: batch ids repeat across stores that report to one server."""
        return f"batch-{self.batch_id}-{store_tag(self.db_url)}"

    def parameters(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "db_url": flow_param_url(self.db_url), "chunk": self.chunk,
                "poll_s": self.poll_s, "show_progress": False}


@dataclass
class Deployed:
    deployment: str  # flow/deployment name
    deployment_id: str
    flow_runs: list[tuple[str, str]] = field(default_factory=list)  # (name, id)


def deploy_join(spec: JoinDeployment) -> Deployed:
    """Register (or update) the batch's deployment of `join_flow` on the pool, and create
    `spec.workers` flow runs of it (scheduled now; the pool's workers pick them up)."""
    from prefect import get_client
    from prefect.deployments.runner import RunnerDeployment
    from prefect.types.entrypoint import EntrypointType

    tags = batch_tags(spec.db_url, spec.batch_id)
    # Called from sync code: Prefect's async_dispatch methods return their value, not a coroutine.
    deployment = cast(RunnerDeployment, join_flow.to_deployment(
        name=spec.name, parameters=spec.parameters(), work_pool_name=spec.work_pool, tags=tags,
        entrypoint_type=EntrypointType.MODULE_PATH,
        description=f"agentbatch workers of batch {spec.batch_id} ({spec.batch_name}): each flow run claims "
        "unfinished samples under leases until the batch is finished",
    ))
    deployment_id = cast(UUID, apply_deployment(deployment))
    out = Deployed(deployment=f"{FLOW_NAME}/{spec.name}", deployment_id=str(deployment_id))
    base = flow_run_name(spec.batch_id, spec.batch_name)
    with get_client(sync_client=True) as client:
        for k in range(1, spec.workers + 1):
            run = client.create_flow_run_from_deployment(deployment_id, name=f"{base}-worker-{k}", tags=tags)
            out.flow_runs.append((run.name, str(run.id)))
    return out


def work_pool_problem(pool: str) -> str | None:
    """None when the Prefect server has work pool `pool`, else what is wrong."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            names = sorted(p.name for p in client.read_work_pools())
            known = f"the server has {', '.join(names)}" if names else "the server has none"
            return (f"--work-pool: no work pool {pool!r} on the Prefect server ({known}); create it with "
                    f"`prefect work-pool create {pool} --type process`")
    return None
