"""One inference step and one environment step: execute, record in the store, retry.

`execute_step` is plain async code, used as the body of the Prefect step tasks (steps mode) and
called directly in lean mode and in the plain-asyncio baseline. Every attempt is a row in the
store, written once when it ends: `completed` with its response (in the same transaction as the
sample's progress) or `failed` with the error. Rows go through the group-committing `StepWriter`
(`db/writer.py`), off the event loop; a step counts as completed only once its row is committed.
Failures are retried by the one retry rule (`protocols/retry.py`); a tool error is an observation
inside a completed step, not a failure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.models import StepStatus
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import (
    Environment,
    EnvironmentFailure,
    TaskSpec,
    restore_mode_of,
)
from agentbatch.protocols.retry import Call
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.agent import AgentState
from agentbatch.tasks.context import BatchContext


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


def _request_record(run: SampleRun, ticket: StepTicket, request: ChatRequest | None) -> dict[str, Any]:
    # The conversation is rebuilt from the initial messages plus the step responses, so only the
    # first inference step stores messages and tools; later ones store a reference.
    if request is None:
        return {"from_step": ticket.step_index - 1}
    record: dict[str, Any] = {"n_messages": len(request.messages), "priority": request.priority}
    if ticket.step_index == 0:
        record.update(messages=request.messages, tools=request.tools)
    elif run.meta.get("tools_changed"):
        record["tools"] = request.tools
    return record


def _step_row(batch: BatchContext, run: SampleRun, ticket: StepTicket, attempt: int,
              task_run_id: str | None) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id, "sample_id": run.sample_id, "index": ticket.step_index,
        "kind": str(ticket.kind), "attempt": attempt, "enqueued_at": ticket.enqueued_at,
        "started_at": time.time(), "task_run_id": task_run_id,
    }


async def _run_inference(batch: BatchContext, run: SampleRun, ticket: StepTicket, row: dict[str, Any]) -> None:
    request = _inference_request(batch, run, ticket)
    assert ticket.worker is not None
    row.update(request=_request_record(run, ticket, request), worker=ticket.worker)
    result = await batch.engines[ticket.worker].complete(request)
    row.update(
        response=AgentState.inference_record(result), prompt_tokens=result.prompt_tokens,
        cached_prompt_tokens=result.cached_prompt_tokens, recomputed_tokens=result.recomputed_tokens,
        output_tokens=result.output_tokens, prefill_s=result.prefill_s, decode_s=result.decode_s,
        engine_queue_s=result.queue_s, worker=result.worker or ticket.worker,
    )
    await _commit(batch, row, {"steps_done": ticket.step_index + 1, "last_worker": row["worker"]})
    run.state.apply_inference(result.message)


async def _run_environment(batch: BatchContext, run: SampleRun, ticket: StepTicket, row: dict[str, Any],
                           slot: str) -> None:
    assistant = run.state.last_assistant
    assert assistant is not None
    row.update(request=_request_record(run, ticket, None), worker=slot)
    # State kept elsewhere: mark the step in flight first, so that a crash before its record leaves a
    # trace ("may have executed" on resume) instead of a silent second execution.
    external = restore_mode_of(run.env) == "external"
    if external:
        await batch.writer.update_sample(run.sample_id, {"in_flight_step": ticket.step_index})
    try:
        # asyncio.timeout runs the step in this task (wait_for would start another and resume us
        # only after every other ready callback, which a busy loop turns into seconds of "execution").
        async with asyncio.timeout(batch.step_timeout_s):
            result = await run.env.step(assistant)
    except TimeoutError as exc:
        raise EnvironmentFailure(f"environment step timed out after {batch.step_timeout_s} s") from exc
    record = AgentState.environment_record(result)
    row.update(response=record, tool_calls=result.tool_calls)
    await _commit(batch, row, {"steps_done": ticket.step_index + 1, **({"in_flight_step": None} if external else {})})
    if "tools" in record:
        run.meta["tools_changed"] = True
    run.state.apply_environment(result.messages, result.done, record.get("tools"))


async def _commit(batch: BatchContext, row: dict[str, Any], advance: dict[str, Any]) -> None:
    """The step counts as completed once this returns: its row and the sample's progress are committed
    together by the group writer."""
    row.update(status=StepStatus.COMPLETED, finished_at=time.time())
    await batch.writer.write_step(row, advance)
    if batch.on_commit is not None:
        batch.on_commit(row)


async def _attempt(batch: BatchContext, run: SampleRun, ticket: StepTicket, slot: str, task_run_id: str | None,
                   attempt: int) -> None:
    """One attempt; its row is written once, when it ends (completed, or failed with the error)."""
    row = _step_row(batch, run, ticket, attempt, task_run_id)
    try:
        if ticket.kind == StepKind.INFERENCE:
            await _run_inference(batch, run, ticket, row)
        else:
            await _run_environment(batch, run, ticket, row, slot)
    except BaseException as exc:
        if row.get("status") == StepStatus.COMPLETED:
            raise  # the commit itself failed or was cancelled: nothing else to record
        row.update(status=StepStatus.FAILED, finished_at=time.time(), error=f"{exc.__class__.__name__}: {exc}")
        if isinstance(exc, asyncio.CancelledError):
            batch.writer.post_step(row)  # cannot await any more; recorded for the history
        else:
            await batch.writer.write_step(row)
        raise


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
