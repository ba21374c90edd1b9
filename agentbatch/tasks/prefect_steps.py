"""The Prefect tasks: one per inference step, one per environment step (steps mode), and one per
sample chain (chains mode, the default). Their bodies are the plain functions of
`steps.py` and `chain.py`. Chains mode also lists every step in Prefect, as batched events
(`step_events.py`) that never sit on a step's critical path.

Which to use (measured by bench/live_throughput.py; docs/scale-out.md has the figures):
- chains: a task run per sample, each step in an `agentbatch.steps.completed` event; the batch
  runs at store speed and costs the Prefect server a task run per sample plus a few events a second.
- steps: a task run per step, gated by the custom task runner; each step is a task run in the UI,
  but the server records only ~20-25 task runs a second, which caps the batch; for small batches
  with real (second-long) step latencies.
- lean (no task here): the flow run only; samples and steps only in agentbatch's store, so the batch
  costs the Prefect server nothing per sample or step (the fastest mode; flows/batch.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.futures import PrefectConcurrentFuture, PrefectFuture
from prefect.utilities.annotations import quote

from agentbatch.db.models import Sample, SampleStatus
from agentbatch.protocols.retry import StepFailed
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.chain import StepExecutor, direct_executor, run_sample
from agentbatch.tasks.context import BatchContext
from agentbatch.tasks.runner import gated
from agentbatch.tasks.steps import SampleRun, execute_step

log = logging.getLogger(__name__)

_TASK_OPTIONS: dict[str, Any] = dict(cache_policy=NO_CACHE, persist_result=False, log_prints=False)


T = TypeVar("T")


def _opaque(value: T) -> T:
    """`quote(value)`: Prefect hands the value to the task without walking it for futures (the
    conversation, the batch's objects). Typed as the value itself, which is what the task receives."""
    return cast(T, quote(value))


def _task_run_id() -> str | None:
    ctx = TaskRunContext.get()
    return str(ctx.task_run.id) if ctx else None


@gated  # the custom task runner gives it an engine-worker slot first
@task(name="inference", task_run_name="s{ticket.sample.sample_id}-inference-{ticket.step_index}", **_TASK_OPTIONS)
async def inference_task(ticket: StepTicket, run: SampleRun, batch: BatchContext, slot: str = "") -> None:
    await execute_step(batch, run, ticket, slot, task_run_id=_task_run_id())


@gated  # ... and this one an environment slot
@task(name="environment", task_run_name="s{ticket.sample.sample_id}-environment-{ticket.step_index}",
      **_TASK_OPTIONS)
async def environment_task(ticket: StepTicket, run: SampleRun, batch: BatchContext, slot: str = "") -> None:
    await execute_step(batch, run, ticket, slot, task_run_id=_task_run_id())


@dataclass(eq=False)
class ChainOutcome:
    """What the chain's own code saw, whatever Prefect records: Prefect's bookkeeping around a task run
    (tag concurrency slots, state changes) can fail on a busy server (e.g. 503) before or after the
    body; the sample must not fail for that."""

    started: bool = False
    status: SampleStatus | None = None


async def _task_state(future: PrefectFuture[Any]) -> State | Exception:
    assert isinstance(future, PrefectConcurrentFuture), "the batch flow's task runner is CoordinatedTaskRunner"
    try:
        return await asyncio.wrap_future(future.wrapped_future)
    except Exception as exc:  # noqa: BLE001 - Prefect raised around the task run (e.g. slot acquisition)
        return exc


async def _settle(state: State | Exception, outcome: ChainOutcome, sample: Sample,
                  run_directly: Callable[[], Awaitable[SampleStatus]]) -> SampleStatus:
    """The sample's status from its chain; a task run that Prefect could not start runs the chain
    without Prefect instead of failing the sample."""
    if outcome.status is not None:
        return outcome.status
    refused = isinstance(state, Exception) or state.is_failed() or state.is_crashed()
    if not outcome.started and refused:
        error = state if isinstance(state, Exception) else await state.aresult(raise_on_failure=False)
        log.warning("sample %s: Prefect could not start its task run (%s); running the chain without it",
                    sample.index, error)
        return await run_directly()
    if isinstance(state, Exception):
        raise state
    return SampleStatus(await state.aresult(raise_on_failure=True))


async def prefect_step_executor(batch: BatchContext, run: SampleRun, ticket: StepTicket) -> None:
    """Steps mode: submit the step as a Prefect task run; the custom task runner gates it."""
    step_task = inference_task if ticket.kind == StepKind.INFERENCE else environment_task
    # _opaque(): Prefect must not walk the conversation and the batch's objects looking for futures
    index = run.state.step_index
    future = step_task.submit(ticket=ticket, run=_opaque(run), batch=_opaque(batch))
    state = await _task_state(future)
    if run.state.step_index != index:  # the step completed; a Prefect error after it does not matter
        return
    if isinstance(state, Exception):  # Prefect could not run the task run (e.g. a busy server's 503)
        log.warning("step %s of sample %s: Prefect could not run its task run (%s); running it without",
                    ticket.step_index, run.sample_id, state)
        await direct_executor(batch, run, ticket)
        return
    if state.is_failed() or state.is_crashed():
        exc = await state.aresult(raise_on_failure=False)
        if isinstance(exc, StepFailed | asyncio.CancelledError):
            raise exc
        raise StepFailed(f"{ticket.kind} step {ticket.step_index}: task run failed: {exc!r}")


@task(name="sample-chain", task_run_name="sample-{sample.index}-{sample.task_id}", **_TASK_OPTIONS)
async def visible_chain_task(sample: Sample, progress: SampleProgress, batch: BatchContext,
                             outcome: ChainOutcome | None = None) -> str:
    """A sample chain whose steps carry this task run's id and are listed in step events."""
    outcome = outcome or ChainOutcome()
    outcome.started = True
    outcome.status = await run_sample(batch, sample, progress, _executor_for(_task_run_id()), admitted=True)
    return str(outcome.status)


def _executor_for(task_run_id: str | None) -> StepExecutor:
    async def execute(batch: BatchContext, run: SampleRun, ticket: StepTicket) -> None:
        slot = await batch.coordinator.acquire(ticket)
        try:
            await execute_step(batch, run, ticket, slot, task_run_id=task_run_id)
        finally:
            batch.coordinator.release(ticket, slot)

    return execute


async def run_sample_visible(batch: BatchContext, sample: Sample, progress: SampleProgress) -> SampleStatus:
    """Chains mode: admit, then one Prefect task run for the chain; its steps go out as events (the
    flow gives the batch context a `StepEvents` hook, `step_events.py`)."""
    await batch.coordinator.admit(progress)
    outcome = ChainOutcome()
    future = visible_chain_task.submit(sample=_opaque(sample), progress=progress, batch=_opaque(batch),
                                       outcome=_opaque(outcome))
    state = await _task_state(future)
    return await _settle(state, outcome, sample,
                         lambda: run_sample(batch, sample, progress, direct_executor, admitted=True))
