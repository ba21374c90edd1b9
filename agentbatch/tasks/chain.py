"""Drive one sample's chain: admit, rebuild from the store (resume), step until done, score.

How each step is executed is passed in (`StepExecutor`): through Prefect tasks and the custom task
runner (steps mode) or directly under the coordinator (chains and lean modes, plain-asyncio baseline).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from agentbatch.db.models import Sample, SampleStatus
from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import Environment, TaskSpec, recorded_turns
from agentbatch.protocols.retry import Call, Effects, StepFailed
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.agent import AgentState
from agentbatch.tasks.context import BatchContext
from agentbatch.tasks.env_thread import off_the_loop
from agentbatch.tasks.reconcile import IN_FLIGHT, in_flight_step, reconcile_in_flight
from agentbatch.tasks.steps import SampleRun, execute_step

log = logging.getLogger(__name__)

StepExecutor = Callable[[BatchContext, SampleRun, StepTicket], Awaitable[None]]


async def direct_executor(batch: BatchContext, run: SampleRun, ticket: StepTicket) -> None:
    """Take the step's slot from the coordinator, run it, give the slot back."""
    slot = await batch.coordinator.acquire(ticket)
    try:
        await execute_step(batch, run, ticket, slot)
    finally:
        batch.coordinator.release(ticket, slot)


async def run_sample(
    batch: BatchContext, sample: Sample, progress: SampleProgress, execute: StepExecutor, *, admitted: bool = False
) -> SampleStatus:
    """Run one sample to its end. `admitted`: the caller already took its admission slot."""
    coordinator = batch.coordinator
    if not admitted:
        await coordinator.admit(progress)
    status: SampleStatus | None = None  # None: cut short (cancelled), neither completed nor failed
    try:
        status = await _run_admitted(batch, sample, progress, execute)
        return status
    finally:
        if batch.on_sample_end is not None and status is not None:  # before the slot is freed (--fail-on-error)
            batch.on_sample_end(sample.id, status)
        coordinator.finish(progress)


async def _run_admitted(batch: BatchContext, sample: Sample, progress: SampleProgress,
                        execute: StepExecutor) -> SampleStatus:
    await batch.writer.update_sample(sample.id, {"status": SampleStatus.RUNNING, "admitted_at": time.time()})
    task = TaskSpec(task_id=sample.task_id, data=sample.task or {}, group=sample.task_group or "")
    env = off_the_loop(batch.workload.create(task), batch.step_timeout_s)  # blocking code: own thread
    try:
        fresh = sample.status == SampleStatus.PENDING and not sample.retries  # retried: rebuild first
        run = await _start(batch, sample.id, task, env, progress, fresh=fresh)
        if stop := await reconcile_in_flight(batch, sample.id, sample.task_id, env, run.state.last_assistant,
                                             run.meta):  # a step cut short by a crash, and nobody can tell
            await _finish(batch, sample.id, score=None, result=None, error=stop)
            return SampleStatus.FAILED
        while not run.state.done and run.state.step_index < batch.max_steps:
            ticket = StepTicket(
                sample=progress, kind=run.state.next_kind, step_index=run.state.step_index,
                enqueued_at=batch.clock(),
            )
            await execute(batch, run, ticket)
        result = await _score(batch, env)
        if not run.state.done:
            result["stopped"] = f"step limit {batch.max_steps} reached"
        await _finish(batch, sample.id, score=float(result["score"]), result=result)
        return SampleStatus.COMPLETED
    except Exception as exc:  # StepFailed, or an environment or scorer error: this sample fails, not the batch
        log.warning("sample %s (%s) failed: %s", sample.index, sample.task_id, exc,
                    exc_info=not isinstance(exc, StepFailed))
        await _finish(batch, sample.id, score=None, result=None, error=str(exc))
        return SampleStatus.FAILED
    finally:
        await env.close()


async def _score(batch: BatchContext, env: Environment) -> dict[str, Any]:
    """Score the sample under the step timeout; scoring has no side effects, so any error is
    retried (as many times as an environment step), then fails the sample with StepFailed."""

    async def attempt(n: int) -> dict[str, Any]:
        async with asyncio.timeout(batch.step_timeout_s):
            result = await env.score()
        return {**result, "score": float(result["score"])}

    return await batch.retry.run(Call(StepKind.ENVIRONMENT, "scoring", Effects.NONE), attempt)


async def _finish(batch: BatchContext, sample_id: int, *, score: float | None, result: dict[str, Any] | None,
                  error: str | None = None) -> None:
    await batch.writer.update_sample(sample_id, {
        "status": SampleStatus.FAILED if error else SampleStatus.COMPLETED, "score": score, "result": result,
        "error": error, "finished_at": time.time(),
    })


async def _start(
    batch: BatchContext, sample_id: int, task: TaskSpec, env: Environment, progress: SampleProgress, *,
    fresh: bool = False,
) -> SampleRun:
    """Reset the environment and rebuild the sample from the store, retrying infrastructure
    failures (an image that is missing, an engine that is down) as environment steps are; when the
    retries run out the sample fails, not the batch."""

    async def attempt(n: int) -> SampleRun:
        run = SampleRun(sample_id, task, env, AgentState.start(await env.reset(task)), progress)
        if not fresh:  # a sample never admitted before has nothing recorded: skip the read
            await _rebuild(batch, run)
        return run

    return await batch.retry.run(Call(StepKind.ENVIRONMENT, f"sample {sample_id}: environment start"), attempt)


async def _rebuild(batch: BatchContext, run: SampleRun) -> None:
    """Replay the sample's completed steps from the store: nothing completed is executed again; the
    environment only rebuilds its internal state from the recorded assistant turns."""
    history = batch.store.step_history(run.sample_id)
    records = history.completed
    run.prior_attempts = history.attempts
    if (cut := in_flight_step(history)) is not None:  # asked to the environment once it is restored
        run.meta[IN_FLIGHT] = cut
    results: list[list[Message]] = []  # each completed environment step's recorded messages
    for expected, record in enumerate(records):
        if record.index != expected:
            raise RuntimeError(f"sample {run.sample_id}: recorded steps have a gap at {expected}")
        run.state.apply_record(record.kind, record.response or {})
        if record.kind == StepKind.ENVIRONMENT:
            results.append(list((record.response or {}).get("messages") or []))
        if record.response and "tools" in record.response:
            run.meta["tools_changed"] = True
    if run.state.assistants:
        await run.env.restore(recorded_turns(run.state.assistants, results))
    run.progress.steps_done = len(records)


async def drive_all(coros: Iterable[Coroutine[Any, Any, Any]],
                    feed: Callable[[Callable[[Coroutine[Any, Any, Any]], Any]], Coroutine[Any, Any, None]] | None
                    = None) -> None:
    """Run the sample coroutines under one asyncio.TaskGroup: an unexpected error cancels the others
    and waits for them to unwind (so engines and workloads are closed after the samples, not under
    them); the first error is raised as itself. `feed(spawn)`: runs beside them and may add more."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
            if feed is not None:
                group.create_task(feed(group.create_task))
    except BaseExceptionGroup as errors:
        first = errors.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
