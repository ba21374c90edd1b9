"""One inference step and one environment step: execute, record in the store, retry.

`execute_step` is plain async code, used as the body of the Prefect step tasks (steps mode) and
called directly in lean mode and in the plain-asyncio baseline. Every attempt is a `StepAttempt`
(`db/step_records.py`), one row in the store: begun (posted: the writer gives it a `running` row only if
it is still running a moment later), then `completed` with its response (committed in the same
transaction as the sample's progress, and awaited: a step counts as completed only once its row is
committed) or `failed` with the error. Every write goes through the one group-commit writer
(`db/writer.py`), off the event loop.
Failures are retried by the one retry rule (`protocols/retry.py`); a tool error is an observation
inside a completed step, not a failure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.step_records import (
    StepAttempt,
    StepOutcome,
    StepWrite,
    environment_request,
    inference_request,
)
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import (
    UNSAFE_CALLS,
    Environment,
    EnvironmentFailure,
    TaskSpec,
    restore_mode_of,
    unsafe_calls,
)
from agentbatch.protocols.in_flight import RECONCILED
from agentbatch.protocols.retry import Call
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.agent import AgentState
from agentbatch.tasks.context import BatchContext
from agentbatch.tasks.reconcile import reconciled_result


@dataclass(eq=False)
class SampleRun:
    sample_id: int
    task: TaskSpec
    env: Environment
    state: AgentState
    progress: SampleProgress
    meta: dict[str, Any] = field(default_factory=dict)
    prior_attempts: dict[int, int] = field(default_factory=dict)  # step index -> attempts recorded before


def _inference_request(batch: BatchContext, run: SampleRun, ticket: StepTicket) -> ChatRequest:
    return ChatRequest(
        messages=run.state.messages,
        tools=run.state.tools,
        sample_id=run.sample_id,
        task_id=run.task.task_id,
        step_index=ticket.step_index,
        priority=batch.coordinator.request_priority(run.progress),
    )


def _inference_record(run: SampleRun, ticket: StepTicket, request: ChatRequest) -> dict[str, Any]:
    # The conversation is rebuilt from the opening messages plus the step responses, so only the
    # first inference step stores messages and tools; later ones store what is new: nothing.
    first = ticket.step_index == 0
    return inference_request(request.messages, request.tools, request.priority,
                             messages_from=0 if first else len(request.messages),
                             with_tools=first or bool(run.meta.get("tools_changed")))


def _attempt_of(batch: BatchContext, run: SampleRun, ticket: StepTicket, attempt: int, task_run_id: str | None,
                worker: str | None, request: dict[str, Any]) -> StepAttempt:
    return StepAttempt(batch_id=batch.batch_id, sample=run.sample_id, index=ticket.step_index, attempt=attempt,
                       kind=str(ticket.kind), enqueued_at=ticket.enqueued_at, started_at=time.time(),
                       worker=worker, request=request, task_run_id=task_run_id)


async def _run_inference(batch: BatchContext, run: SampleRun, ticket: StepTicket, number: int,
                         task_run_id: str | None) -> None:
    request = _inference_request(batch, run, ticket)
    assert ticket.worker is not None
    attempt = _attempt_of(batch, run, ticket, number, task_run_id, ticket.worker,
                          _inference_record(run, ticket, request))
    batch.writer.record(attempt.begun())
    try:
        result = await batch.engines[ticket.worker].complete(request)
    except BaseException as exc:
        _record_failure(batch, attempt, exc)
        raise
    outcome = StepOutcome(
        response=AgentState.inference_record(result), prompt_tokens=result.prompt_tokens,
        cached_prompt_tokens=result.cached_prompt_tokens, recomputed_tokens=result.recomputed_tokens,
        output_tokens=result.output_tokens, prefill_s=result.prefill_s, decode_s=result.decode_s,
        engine_queue_s=result.queue_s, worker=result.worker or ticket.worker,
    )
    await _commit(batch, attempt.completed(outcome, steps_done=ticket.step_index + 1))
    run.state.apply_inference(result.message)


async def _run_environment(batch: BatchContext, run: SampleRun, ticket: StepTicket, slot: str, number: int,
                           task_run_id: str | None) -> None:
    assistant = run.state.last_assistant
    assert assistant is not None
    external = restore_mode_of(run.env) == "external"
    request = environment_request(from_step=ticket.step_index - 1)
    if external:  # what a resume may run again after a crash (`flows/leased.py` settle_in_flight)
        request[UNSAFE_CALLS] = unsafe_calls(run.env, assistant)
    said, reconciled = reconciled_result(run.meta, ticket.step_index, assistant)  # after a crash (tasks/reconcile.py)
    if said is not None:
        request[RECONCILED] = said
    attempt = _attempt_of(batch, run, ticket, number, task_run_id, slot, request)
    # State kept elsewhere: the attempt's row and the step's in-flight mark are committed before it runs,
    # so that a crash before its record leaves a trace ("may have executed" on resume) instead of a
    # silent second execution.
    if external:
        await batch.writer.commit(attempt.begun({"in_flight_step": ticket.step_index}))
    else:
        batch.writer.record(attempt.begun())
    try:
        # asyncio.timeout runs the step in this task (wait_for would start another and resume us
        # only after every other ready callback, which a busy loop turns into seconds of "execution").
        async with asyncio.timeout(batch.step_timeout_s):
            result = reconciled if reconciled is not None else await run.env.step(assistant)
    except TimeoutError as exc:
        failure = EnvironmentFailure(f"environment step timed out after {batch.step_timeout_s} s")
        _record_failure(batch, attempt, failure)
        raise failure from exc
    except BaseException as exc:
        _record_failure(batch, attempt, exc)
        raise
    record = AgentState.environment_record(result)
    outcome = StepOutcome(response=record, tool_calls=result.tool_calls, worker=slot)
    await _commit(batch, attempt.completed(outcome, steps_done=ticket.step_index + 1,
                                           sample_values={"in_flight_step": None} if external else None))
    if "tools" in record:
        run.meta["tools_changed"] = True
    run.state.apply_environment(result.messages, result.done, record.get("tools"))


def _record_failure(batch: BatchContext, attempt: StepAttempt, exc: BaseException) -> None:
    """The attempt's failed row, posted (a cancelled step cannot await any more)."""
    if isinstance(exc, asyncio.CancelledError):
        batch.writer.record(attempt.cancelled())
    else:
        batch.writer.record(attempt.failed(f"{exc.__class__.__name__}: {exc}"))


async def _commit(batch: BatchContext, write: StepWrite) -> None:
    """The step counts as completed once this returns: its row and the sample's progress are committed
    together by the group writer."""
    await batch.writer.commit(write)
    if batch.on_commit is not None and write.step is not None:
        batch.on_commit(write.step)


async def _attempt(batch: BatchContext, run: SampleRun, ticket: StepTicket, slot: str, task_run_id: str | None,
                   number: int) -> None:
    if ticket.kind == StepKind.INFERENCE:
        await _run_inference(batch, run, ticket, number, task_run_id)
    else:
        await _run_environment(batch, run, ticket, slot, number, task_run_id)


async def execute_step(
    batch: BatchContext, run: SampleRun, ticket: StepTicket, slot: str, task_run_id: str | None = None
) -> None:
    """Run one step with its retries (`protocols/retry.py`); raises StepFailed when it cannot complete."""
    first = run.prior_attempts.get(ticket.step_index, 0)

    async def attempt(n: int) -> None:
        run.prior_attempts[ticket.step_index] = first + n  # numbered once, even if retried elsewhere
        await _attempt(batch, run, ticket, slot, task_run_id, first + n)

    await batch.retry.run(Call(str(ticket.kind), f"{ticket.kind} step {ticket.step_index}"), attempt)
    # The sample's progress (steps done, attained service) advances when the coordinator gets the
    # slot back (`Coordinator.release`), by the scheduling core's one definition, in both clocks.
