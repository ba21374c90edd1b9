"""The batch flow: run (or resume) every sample of a batch as a chain of Prefect tasks.

A run builds each thing once and hands it down: `plan_batch` builds the workload and lists its tasks,
`create_batch` writes the batch to the store the launcher opened, `launch_batch` runs the flow on that
store and workload (`flows/launch.py`: the Prefect server, secrets), `execute_batch` builds the
engines, the coordinator and the steps' context, and drives the samples. Resuming runs the same flow
on an interrupted batch: completed steps are taken from the store and not executed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.context import FlowRunContext

from agentbatch.dashboards.artifacts import BatchProgressArtifact, publish_batch_artifacts, write_report_if
from agentbatch.db.history import suite_priors
from agentbatch.db.leases import UNFINISHED, slot_share
from agentbatch.db.models import BatchStatus, SampleStatus
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter
from agentbatch.engines.metrics import MetricsScraper, engine_endpoints
from agentbatch.engines.registry import make_engines
from agentbatch.environments.registry import make_workload, takes_batch_label
from agentbatch.flows.config import BatchConfig, check_task_names
from agentbatch.flows.crash_watch import watching
from agentbatch.flows.identity import batch_tags, flow_run_name, slug, untagged_task_runs
from agentbatch.flows.launch import launch_flow, prepare_launch, wait_for_prefect
from agentbatch.flows.leased import (
    BatchStopped,
    ClaimWindow,
    FailurePolicy,
    LeaseKeeper,
    finish,
    idle_run,
    window_size,
)
from agentbatch.flows.policy_choice import PolicyChoice, choose_policy, engine_model, publish_choice
from agentbatch.flows.prefect_server import PrefectApi
from agentbatch.flows.progress import BatchWatch
from agentbatch.flows.store_url import shown_url
from agentbatch.protocols.environment import EnvironmentFactory
from agentbatch.protocols.in_flight import reconciles
from agentbatch.protocols.secrets import from_stored, to_stored
from agentbatch.scheduling import registry
from agentbatch.scheduling.admission_order import admission_sequence
from agentbatch.scheduling.policies import AdmissionLimits
from agentbatch.scheduling.types import SampleProgress
from agentbatch.tasks.chain import direct_executor, drive_all, run_sample
from agentbatch.tasks.context import BatchContext
from agentbatch.tasks.coordinator import Coordinator, counters_from_workers
from agentbatch.tasks.prefect_steps import prefect_step_executor, run_sample_visible
from agentbatch.tasks.runner import CoordinatedTaskRunner
from agentbatch.tasks.step_events import StepEvents

log = logging.getLogger("agentbatch.batch")


@dataclass
class BatchOutcome:
    batch_id: int
    status: str
    samples: int
    completed: int
    failed: int
    wall_s: float
    peaks: dict[str, int] = field(default_factory=dict)
    sticky: int = 0
    moves: int = 0
    report_path: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)  # what scheduling.policy ran and why


@dataclass(eq=False)
class BatchPlan:
    """A batch before it is written: its config, the workload built once for the run, and its tasks
    (task id, task data, group) as the samples are created."""

    config: BatchConfig
    workload: EnvironmentFactory
    tasks: list[tuple[str, dict[str, Any], str | None]]


def plan_batch(config: BatchConfig) -> BatchPlan:
    """Build the workload and list its tasks; raises ValueError for a workload that cannot run. A
    workload that labels its sandboxes gets its label now, kept in the batch's stored config, so that
    a resume in another process labels (and cleans up) the same containers."""
    config = with_absolute_paths(with_batch_label(config))
    workload = make_workload(config.workload.kind, config.workload.params)
    tasks = workload.tasks()
    if not tasks:
        raise ValueError(f"workload {config.workload.kind!r} with params {config.workload.params} has no tasks")
    check_task_names(tasks)
    if (check := getattr(workload, "check", None)) is not None:
        check()  # what only its servers or files can tell (EnvironmentFactory: optional `check`)
    return BatchPlan(config, workload, [(t.task_id, t.data, t.group or None) for t in tasks])


def with_batch_label(config: BatchConfig) -> BatchConfig:
    """The config with `workload.params.batch_label` set when the workload takes one and none is given."""
    params = config.workload.params
    if "batch_label" in params or not takes_batch_label(config.workload.kind):
        return config
    label = f"{slug(config.name, 40)}-{uuid.uuid4().hex[:8]}"
    workload = config.workload.model_copy(update={"params": {**params, "batch_label": label}})
    return config.model_copy(update={"workload": workload})


def with_absolute_paths(config: BatchConfig) -> BatchConfig:
    """The config with the workload's relative paths resolved against this folder (a workload that
    declares `absolute_params`), so that the stored config means the same from any folder."""
    resolve = getattr(config.workload_plugin().obj, "absolute_params", None)
    if resolve is None:
        return config
    params = resolve(dict(config.workload.params), Path.cwd())
    if params == config.workload.params:
        return config
    return config.model_copy(update={"workload": config.workload.model_copy(update={"params": params})})


def workload_tasks(config: BatchConfig) -> list[tuple[str, dict[str, Any], str | None]]:
    """The (task id, task data, group) of every sample (for commands that create no batch)."""
    return plan_batch(config).tasks


def create_batch(config: BatchConfig | BatchPlan, store: Store) -> int:
    """Write the batch and its samples. Given a config, it is planned here and its workload only lists
    the tasks (`execute_batch` then builds the one it runs); launchers pass their `plan_batch`."""
    plan = config if isinstance(config, BatchPlan) else plan_batch(config)
    data = to_stored(plan.config.model_dump(mode="json"))  # secrets: environment references
    return store.create_batch(plan.config.name, data, plan.tasks)


def build_coordinator(config: BatchConfig, workers: list[str], *, record: bool = False) -> Coordinator:
    """The live driver over the scheduling core, built as virtual time builds it (`build_core`)."""
    s = config.scheduling
    limits = AdmissionLimits(max_active_samples=s.max_active_samples, env_slots=s.env_slots,
                             per_worker_inflight=s.per_worker_inflight, coupled=s.coupled)
    core = registry.build_core(
        limits, workers, record=record, admission_control=s.admission_control,
        # Policies resolved as plugins (registered names, entry points, "module:Class"), params checked.
        env_queue=config.policy("env_queue"), inference_queue=config.policy("inference_queue"),
        router=config.policy("router"), priority=config.policy("priority"),
    )  # fmt: skip
    return Coordinator(core, clock=time.time)


@dataclass
class AdmissionPlan:
    todo: list[Any]  # the samples, in the order they queue for admission
    priors: dict[str, float]  # task id -> expected chain steps used by the policies


def admission_todo(config: BatchConfig, store: Store, batch_id: int, todo: list[Any]) -> AdmissionPlan:
    """The samples in the order they queue for admission, and the chain-length priors used: the
    config's own (`scheduling.priors`, pinned by controlled replay) or the store's earlier batches."""
    pinned = config.scheduling.priors
    # Unpinned: the suite's earlier runs (else other batches of the same task ids), recorded with the
    # batch so that its summary says where they came from (db/history.py).
    priors = dict(pinned) if pinned is not None else suite_priors(
        store, batch_id, [s.task_id for s in todo]).lengths
    progress = [SampleProgress(sample_id=s.id, task_id=s.task_id, arrival_seq=i, prior_chain_steps=priors.get(s.task_id))
                for i, s in enumerate(todo)]  # fmt: skip
    if config.scheduling.admission_order == "kv_balanced":
        log.warning("admission_order kv_balanced needs context priors and the engines' KV capacity, "
                    "which live batches do not have yet: admitting longest recorded chain first")
    ordered = admission_sequence(progress, config.scheduling.admission_order)
    by_id = {s.id: s for s in todo}
    return AdmissionPlan([by_id[p.sample_id] for p in ordered], priors)


@dataclass(eq=False)
class _LiveBatch:
    """What one process needs to drive its samples of a batch."""

    config: BatchConfig
    keeper: LeaseKeeper
    todo: list[Any]
    batch: BatchContext
    engines: list[Any]
    events: StepEvents | None  # chains mode: the steps as Prefect events
    owns_workload: bool  # built here (closed at the end), else by the run's launcher
    priors: dict[str, float] = field(default_factory=dict)
    total: int = 0
    policy: dict[str, Any] = field(default_factory=dict)  # what scheduling.policy ran (flows/policy_choice.py)
    window: ClaimWindow | None = None  # run / resume: more samples claimed as these finish
    replan: Any = None  # what the run re-plans with (flows/replan.py), None when it does not
    progress: dict[int, SampleProgress] = field(default_factory=dict)  # the running samples' progress


def _chosen_policy(config: BatchConfig, store: Store, batch_id: int, todo: list[Any],
                   workers: int) -> tuple[BatchConfig, AdmissionPlan, PolicyChoice]:
    """The config after `scheduling.policy` (flows/policy_choice.py), its admission plan and the choice."""
    plan = admission_todo(config, store, batch_id, todo)
    choice = choose_policy(config, store, batch_id, [s.task_id for s in todo], workers, plan.priors)
    if choice.config is not config:  # scheduling.policy changed the scheduling: its admission order too
        config = choice.config
        plan = admission_todo(config, store, batch_id, todo)
        # kept with the batch: a resume runs the same choice, the report shows it (scheduling.choice)
        store.set_batch_config(batch_id, to_stored(config.model_dump(mode="json")))
    return config, plan, choice


def _in_order(ordered: list[Any], settled: list[Any]) -> list[Any]:
    """The admission order of the samples still to run after settling those cut short."""
    keep = {s.id for s in settled}
    return [s for s in ordered if s.id in keep]


@dataclass(eq=False)
class _Claim:
    config: BatchConfig
    keeper: LeaseKeeper
    todo: list[Any]  # the samples leased to this process
    window: ClaimWindow | None = None


def _claim(store: Store, batch_id: int, fail_on_error: str | None, claim_limit: int | None) -> _Claim:
    row = store.get_batch(batch_id)
    if row is None:
        raise ValueError(f"no batch {batch_id} in {store.url}")
    config = BatchConfig.model_validate(from_stored(row.config))  # secret references resolved from the env
    keeper = LeaseKeeper(store, batch_id, FailurePolicy.parse(fail_on_error))
    # claim_limit: take at most that many samples (scale-out workers, `agentbatch join`, claim in chunks);
    # else (run, resume) a window now and more as they finish (`_drive`), so joins can share the batch
    if claim_limit is not None:
        return _Claim(config, keeper, keeper.leases.claim(claim_limit))
    size = window_size(config.scheduling.max_active_samples)
    return _Claim(config, keeper, keeper.leases.claim(size), ClaimWindow(keeper.leases, size))


def _settle_claimed(store: Store, keeper: LeaseKeeper, workload: Any, todo: list[Any]) -> list[Any]:
    """Newly claimed samples ready to run: steps left `running` by a process that stopped are marked
    abandoned, external steps cut short settled (`LeaseKeeper.settle_in_flight`)."""
    abandoned = store.abandon_running(keeper.batch_id, keeper.fences(todo))  # only the samples leased here
    if abandoned:
        log.info("batch %s: %d step(s) were running when the last process stopped; retrying them",
                 keeper.batch_id, abandoned)
    # external steps cut short: run again where safe, else asked to the environment or stopped
    return keeper.settle_in_flight(todo, getattr(workload, "in_flight", "retry"), ask=reconciles(workload))


def batch_workload(store: Store, batch_id: int) -> EnvironmentFactory:
    """The workload of a batch in the store, built from its stored config (a resume, a joining worker)."""
    row = store.get_batch(batch_id)
    if row is None:
        raise ValueError(f"no batch {batch_id} in {shown_url(store.url)}")
    config = BatchConfig.model_validate(from_stored(row.config))
    return make_workload(config.workload.kind, config.workload.params, batch_id=batch_id)


def _to_plan(store: Store, claim: _Claim) -> list[Any]:
    """The samples the policy and the admission order are chosen for: those claimed, and under a
    window every unfinished sample the run may claim later."""
    return claim.todo if claim.window is None else store.samples(claim.keeper.batch_id, statuses=UNFINISHED)


def _window_start(claim: _Claim, plan: AdmissionPlan) -> list[Any]:
    """The samples a run starts with. Under a window: the first `size` of the admission order that
    nobody else holds, as virtual time admits them. The first claim came before the plan, in index
    order: those outside the head of the order are given back and the missing ones claimed; the
    window keeps the rest in admission order."""
    window = claim.window
    if window is None:
        return claim.todo
    head = {s.id for s in plan.todo[: window.size]}
    keep = [s for s in claim.todo if s.id in head]
    kept = {s.id for s in keep}
    outside = [s.id for s in claim.todo if s.id not in kept]
    if outside:
        claim.keeper.leases.release(*outside)  # unfinished and now unheld, as before the claim
    window.order = [s.id for s in plan.todo if s.id not in kept]
    return keep + window.take(window.size - len(keep))


def _open(store: Store, batch_id: int, claim: _Claim, workload: EnvironmentFactory | None,
          use_prefect: bool) -> _LiveBatch:
    """Engines, the coordinator (bound to the flow's task runner) and the batch context; the workload
    unless the run was given the one it built (`plan_batch`)."""
    config, keeper, todo = claim.config, claim.keeper, claim.todo
    owned = workload is None
    if workload is None:
        workload = make_workload(config.workload.kind, config.workload.params, batch_id=batch_id)
    engines = make_engines(config.engine.kind, config.engine.params, workload)
    fresh = set(store.status_counts(batch_id)) <= {SampleStatus.PENDING}  # nothing ran before: re-planning replays all
    config, plan, choice = _chosen_policy(config, store, batch_id, _to_plan(store, claim), len(engines))
    coordinator = build_coordinator(config, [e.name for e in engines])
    ctx = FlowRunContext.get()
    if use_prefect and ctx is not None and isinstance(ctx.task_runner, CoordinatedTaskRunner):
        ctx.task_runner.bind(coordinator)
    # Chains mode lists each committed step in Prefect as batched events (the flow starts and closes them).
    events = StepEvents(batch_id) if use_prefect and config.execution.mode == "chains" else None
    batch = batch_context(store, batch_id, config, workload, engines, coordinator, events)
    batch.writer.fences = keeper.leases.tokens  # every write for a sample proves this process still leases it
    for e in engines:
        store.upsert_worker(batch_id, e.name, "engine", endpoint=getattr(e, "base_url", None))
    todo = _settle_claimed(store, keeper, workload, _window_start(claim, plan))
    if config.scheduling.env_slots_scope == "batch":
        keeper.on_owners = env_slot_share(config.scheduling.env_slots, keeper, coordinator)
    live = _LiveBatch(config, keeper, todo, batch, engines, events, owned, total=len(store.samples(batch_id)),
                      policy=choice.summary, replan=choice.plan if fresh and claim.window is not None else None)  # fmt: skip
    live.todo, live.priors = _in_order(plan.todo, todo), plan.priors  # the order they queue for admission
    live.window = claim.window
    store.mark_batch_running(batch_id, str(ctx.flow_run.id) if ctx and ctx.flow_run else None)
    log.info("batch %s (%s): %d of %d samples to run, %d engine worker(s), mode %s", batch_id, config.name,
             len(todo), live.total, len(engines), config.execution.mode if use_prefect else "plain-asyncio")
    return live


def batch_context(store: Store, batch_id: int, config: BatchConfig, workload: Any, engines: list[Any],
                  coordinator: Coordinator, events: StepEvents | None) -> BatchContext:
    """The context of this run's steps; its writer is started and closed by `_drive`."""
    return BatchContext(
        store=store, batch_id=batch_id, workload=workload, engines={e.name: e for e in engines},
        coordinator=coordinator, writer=StepWriter(store),
        retry=config.retries.policy(),
        max_steps=config.limits.max_steps, step_timeout_s=config.limits.step_timeout_s,
        on_commit=events.record if events is not None else None,
    )


def env_slot_share(total: int, keeper: LeaseKeeper, coordinator: Coordinator) -> Callable[[list[str]], None]:
    """Keep this process at its share of the batch's environment slots as processes join and leave."""

    def apply(owners: list[str]) -> None:
        share = slot_share(total, owners, keeper.leases.owner)
        if share != coordinator.env_slots:
            log.info("batch %s: %d process(es) drive it; this one now runs up to %d of its %d environment "
                     "slots", keeper.batch_id, len(owners), share, total)
            coordinator.set_env_slots(share)

    return apply


async def _run_chain(batch: BatchContext, sample: Any, progress: SampleProgress, mode: str | None) -> None:
    """One sample's chain in the execution mode (lean, or None for plain asyncio: no Prefect task run;
    the flow run and the store only)."""
    if mode in (None, "lean"):
        await run_sample(batch, sample, progress, direct_executor)
        return
    with untagged_task_runs():  # batch tags stay on the flow run: tagged task runs cost server calls
        if mode == "chains":
            await run_sample_visible(batch, sample, progress)
        else:
            await run_sample(batch, sample, progress, prefect_step_executor)


async def _drive(live: _LiveBatch, mode: str | None, bar: BatchWatch, artifact: BatchProgressArtifact) -> str | None:
    """Run every claimed sample; returns why the batch stopped early (--fail-on-error), else None."""
    batch, store = live.batch, live.batch.store

    async def drive(sample: Any) -> None:
        progress = SampleProgress(
            sample_id=sample.id, task_id=sample.task_id, arrival_seq=sample.index,
            prior_chain_steps=live.priors.get(sample.task_id), last_worker=sample.last_worker,
        )
        live.progress[sample.id] = progress  # a re-planning switch sets its priors (flows/replan.py)
        try:
            await _run_chain(batch, sample, progress, mode)
        finally:
            live.progress.pop(sample.id, None)
        bar.update(1)
        await artifact.update(bar.n)

    # Workers behind HTTP (vLLM, the simulated server) are scraped for /metrics while the batch
    # runs: the snapshots go to the store, the KV usage and queue lengths to the router.
    endpoints = engine_endpoints(live.engines)
    scraper = MetricsScraper(endpoints, store=store, batch_id=batch.batch_id) if endpoints else None
    if scraper is not None:
        batch.coordinator.load_hook = scraper.fill_loads
        batch.coordinator.engine_counters = lambda: counters_from_workers(scraper.latest.values())
    batch.on_sample_end = functools.partial(live.keeper.sample_ended, batch.coordinator)
    batch.writer.start()  # this flow owns the writer: started before the first step, closed after the last
    if live.events is not None:
        live.events.start()
    try:
        async with scraper or contextlib.nullcontext(), live.keeper, _replanning(live):
            if live.window is None:
                await drive_all(live.keeper.run(s.id, drive(s)) for s in live.todo)
            else:
                await _drive_window(live, drive)
    except BatchStopped as exc:  # --fail-on-error: the remaining samples stay resumable
        return str(exc)
    except BaseException as exc:
        store.finish_batch(batch.batch_id, BatchStatus.FAILED, error=f"{exc.__class__.__name__}: {exc}")
        raise
    finally:
        await bar.aclose()
        await batch.writer.aclose()  # after the samples: their last rows are committed
        if live.events is not None:
            live.events.close()  # after the writer: every committed step is in the last events
        for e in live.engines:
            await e.aclose()
        if live.owns_workload:
            await batch.workload.aclose()
    return None


@contextlib.asynccontextmanager
async def _replanning(live: _LiveBatch) -> AsyncIterator[None]:
    """Re-plan while the samples run, when policy auto chose (flows/replan.py; imported here: the
    simulator is a slow import)."""
    if live.replan is None:
        yield
        return
    from agentbatch.flows.replan import LiveTarget, replanning

    b = live.batch
    model = engine_model(live.config)
    assert model is not None  # policy auto chose: the engines' timing is known
    target = LiveTarget(b.store, b.batch_id, live.config, b.coordinator, lambda: len(live.keeper.leases.live_owners()),
                        live.window, live.priors, live.progress,
                        {s.id: (s.task_id, s.index) for s in b.store.samples(b.batch_id)},
                        [e.name for e in live.engines], live.policy)  # fmt: skip
    async with replanning(live.replan, model[1], target):
        yield


async def _drive_window(live: _LiveBatch, drive: Callable[[Any], Any]) -> None:
    """Run the claimed samples and claim more, in admission order, each time a quarter of the window
    has finished, until none is left to claim and every sample claimed has ended."""
    window = live.window
    assert window is not None
    active: set[int] = set()
    ended = asyncio.Event()

    async def one(sample: Any) -> None:
        try:
            await live.keeper.run(sample.id, drive(sample))
        finally:
            active.discard(sample.id)
            ended.set()

    def more() -> list[Any]:  # in a thread: claims and settles read and write the store
        new = window.take(window.size - len(active))  # in admission order
        return _in_order(new, _settle_claimed(live.batch.store, live.keeper, live.batch.workload, new))

    async def feed(spawn: Callable[[Any], Any]) -> None:
        while True:
            if window.order and len(active) <= window.size - max(1, window.size // 4):
                for sample in await asyncio.to_thread(more):
                    active.add(sample.id)
                    spawn(one(sample))
            if not active and not window.order:
                return
            await ended.wait()
            ended.clear()

    active.update(s.id for s in live.todo)
    await drive_all((one(s) for s in live.todo), feed=feed)


async def execute_batch(store: Store, batch_id: int, *, workload: EnvironmentFactory | None = None,
                        use_prefect: bool = True, show_progress: bool | str | None = None, report_dir: Path | None = None,
                        fail_on_error: str | None = None, claim_limit: int | None = None) -> BatchOutcome:
    """Run the pending and interrupted samples of a batch that no other process drives (sample
    leases). `workload`: the one the run's launcher built (and closes); else one is built here. With
    use_prefect=False the same chains run in plain asyncio (the overhead benchmark's baseline)."""
    claim = _claim(store, batch_id, fail_on_error, claim_limit)
    config, keeper = claim.config, claim.keeper
    if not claim.todo:  # finished, or every unfinished sample is driven by another process
        idle = idle_run(keeper)
        log.info("%s", idle.message)
        return BatchOutcome(batch_id=batch_id, status=idle.status, samples=idle.samples,
                            completed=idle.samples - idle.failed, failed=idle.failed, wall_s=0.0)
    live = _open(store, batch_id, claim, workload, use_prefect)
    ctx = FlowRunContext.get()
    with watching(store.url, batch_id, str(ctx.flow_run.id) if use_prefect and ctx and ctx.flow_run else None):
        return await _execute(store, batch_id, live, config, keeper, use_prefect, show_progress, report_dir)


async def _execute(store: Store, batch_id: int, live: _LiveBatch, config: BatchConfig, keeper: LeaseKeeper,
                   use_prefect: bool, show_progress: bool | str | None, report_dir: Path | None) -> BatchOutcome:
    """The claimed samples run to the end, and what the batch came to."""
    total, coordinator = live.total, live.batch.coordinator
    # The terminal bar or log lines, the store's heartbeat, logs to the flow run (flows/progress.py).
    counts = store.status_counts(batch_id)
    done = counts.get(SampleStatus.COMPLETED, 0) + counts.get(SampleStatus.FAILED, 0)
    bar = BatchWatch.start(store, batch_id, total=total, done=done, show_progress=show_progress,
                           coordinator=coordinator)
    artifact = BatchProgressArtifact()  # the Prefect UI's progress bar (a no-op outside a flow run)
    await artifact.start(batch_id, total, store.url)
    if use_prefect:
        await publish_choice(live.policy)
    start = time.perf_counter()
    stopped = await _drive(live, config.execution.mode if use_prefect else None, bar, artifact)
    failed = len(store.samples(batch_id, statuses=[SampleStatus.FAILED]))  # this run's and earlier runs'
    status = finish(keeper, stopped)
    await artifact.flush()
    report_path = write_report_if(store, batch_id, report_dir)
    if use_prefect:
        await publish_batch_artifacts(store, batch_id, report_path=report_path)
    return BatchOutcome(
        batch_id=batch_id, status=status, samples=total,
        completed=total - failed, failed=failed, wall_s=time.perf_counter() - start,
        peaks=coordinator.peaks(), sticky=coordinator.sticky, moves=coordinator.moves,
        report_path=str(report_path) if report_path else None, policy=live.policy,
    )


def batch_flow(store: Store, workload: EnvironmentFactory | None = None) -> Flow[..., Any]:
    """The batch's Prefect flow (`agentbatch-batch`), run on the store (and workload) this process
    opened. Its parameters are what the Prefect server records: the batch id, the store URL (its
    password an environment reference, `flows/launch.py`) and the run's options."""

    @flow(name="agentbatch-batch", task_runner=CoordinatedTaskRunner(), validate_parameters=False,
          persist_result=False, log_prints=False)
    async def agentbatch_batch(batch_id: int, db_url: str, show_progress: bool | str | None = None,
                               report_dir: str | None = None, fail_on_error: str | None = None) -> dict[str, Any]:
        outcome = await execute_batch(store, batch_id, workload=workload, show_progress=show_progress,
                                      report_dir=Path(report_dir) if report_dir else None,
                                      fail_on_error=fail_on_error)
        return outcome.__dict__

    return agentbatch_batch


async def launch_batch(store: Store, batch_id: int, *, api: PrefectApi, workload: EnvironmentFactory | None = None,
                       show_progress: bool | str | None = None, report_dir: Path | None = None,
                       fail_on_error: str | None = None) -> BatchOutcome:
    """Run a batch of this store as its flow run `batch-<id>-<name>` (tagged with the batch and the
    store) through `launch_flow`; the workload, when given, is closed at the end."""
    row = store.get_batch(batch_id)
    if row is None:
        raise ValueError(f"no batch {batch_id} in {shown_url(store.url)}")
    params = {"batch_id": batch_id, "db_url": store.url, "show_progress": show_progress,
              "report_dir": str(report_dir) if report_dir else None, "fail_on_error": fail_on_error}
    try:
        result = await launch_flow(batch_flow(store, workload), params, api=api,
                                   run_name=flow_run_name(batch_id, row.name), tags=batch_tags(store.url, batch_id))
    finally:
        if workload is not None:
            await workload.aclose()
    return BatchOutcome(**result)


def run_flow(store: Store, batch_id: int, *, workload: EnvironmentFactory | None = None,
             show_progress: bool | str | None = None, report_dir: Path | None = None,
             fail_on_error: str | None = None) -> BatchOutcome:
    """`launch_batch` from synchronous code, on the Prefect server `prepare_launch` chooses."""
    api = prepare_launch()
    wait_for_prefect(api)
    return asyncio.run(launch_batch(store, batch_id, api=api, workload=workload, show_progress=show_progress,
                                    report_dir=report_dir, fail_on_error=fail_on_error))


def run_batch(config: BatchConfig, store: Store, *, show_progress: bool | str | None = None) -> int:
    """Create a batch from a config and run it through the Prefect flow; returns the batch id."""
    plan = plan_batch(config)
    batch_id = create_batch(plan, store)
    run_flow(store, batch_id, workload=plan.workload, show_progress=show_progress)
    return batch_id
