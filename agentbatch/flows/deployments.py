"""Scheduled evals: the batch flow as a Prefect deployment, its parameter overrides, and `serve`.

`scheduled_eval` is the deployed flow: each run creates a batch from the deployment's config (with
its overrides), links it to the flow run and the deployment, runs it with the suite's priors, and
publishes a markdown artifact with its diff against the suite's previous run.

Deployments need a running `prefect server` (PREFECT_API_URL): schedules are kept and fired by the
server's scheduler service, which Prefect's temporary per-process server does not run long enough to
matter (it lives as long as one command). Two ways to execute the runs:
- `agentbatch serve`: one process polls the server for this machine's deployments (Prefect's
  `Runner`, the engine of `flow.serve`) and runs each due run in a subprocess;
- a work pool (`deploy --work-pool POOL`) with `prefect worker start --pool POOL` on any machine
  that has agentbatch installed: the multi-machine form.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from prefect import flow

from agentbatch.db import history as db_history
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, execute_batch, plan_batch
from agentbatch.flows.config import BatchConfig, ConfigError, load_config
from agentbatch.flows.launch import apply_deployment
from agentbatch.flows.overrides import apply_overrides
from agentbatch.flows.store_url import url_from_param
from agentbatch.protocols.secrets import install_log_redaction
from agentbatch.tasks.runner import CoordinatedTaskRunner

FLOW_NAME = "agentbatch-scheduled-eval"


def resolve_config(config: dict[str, Any] | None, config_path: str | None,
                   overrides: list[str] | None) -> BatchConfig:
    """The run's config: the stored one, or the file read where the run executes, plus overrides."""
    if config is not None:
        cfg = BatchConfig.model_validate(config)
    elif config_path:
        cfg = load_config(config_path)
    else:
        raise ConfigError("a scheduled eval needs `config` or `config_path`")
    return apply_overrides(cfg, list(overrides or []))[0] if overrides else cfg


def _run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    name = (params.get("config") or {}).get("name") or Path(params.get("config_path") or "eval").stem
    return f"{name}-{params['tag']}" if params.get("tag") else str(name)


def _deployment_origin() -> tuple[str | None, str | None]:
    from prefect.runtime import deployment

    name = deployment.name
    return (f"{FLOW_NAME}/{name}" if name else None), (str(deployment.id) if deployment.id else None)


@flow(name=FLOW_NAME, task_runner=CoordinatedTaskRunner(), flow_run_name=_run_name, persist_result=False,
      log_prints=False)
async def scheduled_eval(config: dict[str, Any] | None = None, config_path: str | None = None,
                         overrides: list[str] | None = None, tag: str | None = None, db_url: str | None = None,
                         score_threshold: float = 0.0, makespan_threshold: float | None = None,
                         report_dir: str | None = None) -> dict[str, Any]:
    """One scheduled run of a suite: a new batch, run with the suite's priors, diffed with the
    suite's previous run (a markdown artifact flags regressions beyond the thresholds)."""
    from agentbatch.dashboards.history import diff_with_previous, publish_diff_artifact

    install_log_redaction()  # as every launch (flows/launch.py); this flow runs where a worker starts it
    plan = plan_batch(resolve_config(config, config_path, overrides))  # the workload, built once for the run
    store = Store(url_from_param(db_url) if db_url else None)  # a `${VAR}` password resolved here
    try:
        batch_id = create_batch(plan, store)
        deployment, deployment_id = _deployment_origin()
        db_history.record_origin(store, batch_id, tag=tag, deployment=deployment, deployment_id=deployment_id)
        out = Path(report_dir) / f"batch-{batch_id}" if report_dir else None
        outcome = await execute_batch(store, batch_id, workload=plan.workload, show_progress=False, report_dir=out)
        diff = diff_with_previous(store, batch_id, threshold=score_threshold, makespan_threshold=makespan_threshold)
        await publish_diff_artifact(store, batch_id, diff, deployment)
        return {**outcome.__dict__, "previous_batch_id": diff.before.batch_id if diff else None,
                "regressions": diff.regressions if diff else 0, "flags": diff.flags if diff else []}
    finally:
        await plan.workload.aclose()
        store.close()


@dataclass
class DeploySpec:
    name: str
    parameters: dict[str, Any]
    cron: str | None = None
    interval_s: float | None = None
    anchor: datetime | None = None  # with interval_s: the runs fall on anchor + k x interval
    on_event: str | None = None  # also a run per Prefect event of this name (tag: the event's resource name)
    work_pool: str | None = None
    description: str | None = None


def build_deployment(spec: DeploySpec, paused: bool) -> Any:
    """The RunnerDeployment of `scheduled_eval` (module entrypoint, so any process with agentbatch
    installed can load it)."""
    from prefect.schedules import Cron, Interval
    from prefect.types.entrypoint import EntrypointType

    schedule = Cron(spec.cron) if spec.cron else Interval(float(spec.interval_s or 0), anchor_date=spec.anchor)
    return scheduled_eval.to_deployment(
        name=spec.name, schedules=[schedule], parameters=spec.parameters, description=spec.description,
        tags=["agentbatch"], work_pool_name=spec.work_pool, paused=paused, entrypoint_type=EntrypointType.MODULE_PATH,
        triggers=[event_trigger(spec.on_event)] if spec.on_event else None,
    )


def event_trigger(event: str) -> Any:
    """A run per event named `event` (e.g. emitted by a training job after each checkpoint:
    `prefect event emit agentbatch.checkpoint --resource-id ckpt.0412 --resource
    prefect.resource.name=ckpt-0412`), tagged with the event's resource name."""
    from prefect.events import DeploymentEventTrigger

    return DeploymentEventTrigger(expect={event}, match={"prefect.resource.id": "*"},
                                  parameters={"tag": "{{ event.resource.name }}"})


def deploy(spec: DeploySpec) -> str:
    """Register (or update) the deployment on the Prefect server; returns its id. A new served
    deployment starts paused (`serve` resumes it while it runs); an update keeps its paused state,
    so redeploying under a running `serve` does not stop it. Work-pool deployments are active."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    paused = spec.work_pool is None
    if paused:
        with get_client(sync_client=True) as client:
            try:
                paused = bool(client.read_deployment_by_name(f"{FLOW_NAME}/{spec.name}").paused)
            except ObjectNotFound:
                pass
    return str(apply_deployment(build_deployment(spec, paused)))


async def served_deployments(names: list[str]) -> tuple[list[Any], list[str]]:
    """The deployments of `scheduled_eval` on the server to serve here (all without a work pool, or
    those named), and the names asked for that do not exist or belong to a work pool."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    async with get_client() as client:
        found = await client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])))
    servable = [d for d in found if not d.work_pool_name]
    if not names:
        return servable, []
    chosen = [d for d in servable if d.name in names]
    return chosen, sorted(set(names) - {d.name for d in chosen})


async def serve(deployments: list[Any], *, limit: int | None, poll_s: float) -> None:
    """Run the deployments' scheduled runs until stopped (Ctrl-C / SIGTERM); their schedules are
    resumed now and paused again when this process stops."""
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.runner import Runner
    from prefect.types.entrypoint import EntrypointType

    runner = Runner(name="agentbatch-serve", limit=limit, query_seconds=poll_s, pause_on_shutdown=True)
    for d in deployments:
        schedules = [DeploymentScheduleCreate(schedule=s.schedule, active=s.active) for s in d.schedules]
        runner_deployment = await scheduled_eval.ato_deployment(
            name=d.name, schedules=schedules, parameters=d.parameters, description=d.description, tags=d.tags,
            paused=False, entrypoint_type=EntrypointType.MODULE_PATH,
        )
        await runner.aadd_deployment(runner_deployment)
    await runner.start()
