"""The Prefect tasks: one per inference step, one per environment step, and (lean mode) one per
sample chain. Their bodies are the plain functions of `steps.py` and `chain.py`."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.utilities.annotations import quote

from agentbatch.db.models import Sample, SampleStatus
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.chain import direct_executor, run_sample
from agentbatch.tasks.runner import gated
from agentbatch.tasks.steps import BatchContext, SampleRun, StepFailed, execute_step

_TASK_OPTIONS: dict[str, Any] = dict(cache_policy=NO_CACHE, persist_result=False, log_prints=False)


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


@task(name="sample-chain", task_run_name="sample-{sample.index}-{sample.task_id}", **_TASK_OPTIONS)
async def sample_chain_task(sample: Sample, progress: SampleProgress, batch: BatchContext) -> str:
    return str(await run_sample(batch, sample, progress, direct_executor, admitted=True))


async def prefect_step_executor(batch: BatchContext, run: SampleRun, ticket: StepTicket) -> None:
    """Steps mode: submit the step as a Prefect task run; the custom task runner gates it."""
    step_task = inference_task if ticket.kind == StepKind.INFERENCE else environment_task
    # quote(): Prefect must not walk the conversation and the batch's objects looking for futures
    future = step_task.submit(ticket=ticket, run=quote(run), batch=quote(batch))
    state = await asyncio.wrap_future(future.wrapped_future)
    if state.is_failed():
        exc = await state.aresult(raise_on_failure=False)
        if isinstance(exc, StepFailed | asyncio.CancelledError):
            raise exc
        raise StepFailed(f"{ticket.kind} step {ticket.step_index}: task run failed: {exc!r}")


async def run_sample_lean(batch: BatchContext, sample: Sample, progress: SampleProgress) -> SampleStatus:
    """Lean mode: admit, then one Prefect task run for the whole chain."""
    await batch.coordinator.admit(progress)
    future = sample_chain_task.submit(sample=quote(sample), progress=progress, batch=quote(batch))
    state = await asyncio.wrap_future(future.wrapped_future)
    value = await state.aresult(raise_on_failure=True)
    return SampleStatus(value)
