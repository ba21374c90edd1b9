"""One step attempt as every driver records it, and the one JSON format of its request and response.

The runner (`tasks/steps.py`, also under `agentbatch join`) and both gateways describe an attempt
with a `StepAttempt` and hand its writes to the one group-commit writer (`db/writer.py`): `begun()`
when it starts, then exactly one of `completed(...)`, `failed(...)` or `cancelled(...)`. Each write
becomes part of the attempt's single `steps` row; a completion carries the sample's progress, which
is committed in the same transaction.

The `request` and `response` columns hold the shapes built here, whoever drove the step:

- inference request: `{"n_messages", "priority", "messages_from", "messages", ["tools"]}`: the
  request's messages from index `messages_from` on; the ones before it are known from the sample's
  earlier steps (the runner: its opening messages and the step responses; a gateway: the previous
  request). `tools` when they are new or changed.
- inference response: `{"message", "finish_reason", ["id"]}`.
- environment request: `{"from_step": i}` (the tool calls of inference step i's message) or
  `{"calls": [{"name", "server", "arguments"}]}` (calls no recorded step holds: the tool gateway).
- environment response: `{"messages", "done", ["tools"], ["tool_errors"]}`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentbatch.db.models import StepStatus

_OUTCOME_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s",
                   "decode_s", "engine_queue_s", "tool_calls")


@dataclass(eq=False, slots=True)
class SampleRef:
    """A sample row that writes may refer to before it is written (a gateway learns of a sample from
    its first request): `id` is set when the writer inserts it, and writes run in order, so every later
    write finds it."""

    id: int | None = None

    @property
    def row_id(self) -> int:
        if self.id is None:
            raise RuntimeError("the sample row is not written yet")
        return self.id


SampleKey = int | SampleRef  # a sample row id, or a row about to be written


def sample_id_of(sample: SampleKey) -> int:
    return sample.row_id if isinstance(sample, SampleRef) else sample


@dataclass(slots=True)
class StepOutcome:
    """What a completed attempt writes back."""

    response: dict[str, Any]
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    recomputed_tokens: int | None = None
    output_tokens: int | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    engine_queue_s: float | None = None
    tool_calls: int | None = None
    worker: str | None = None


@dataclass(slots=True)
class StepWrite:
    """One write of the writer's queue: a step attempt's row when it begins or ends (`step`), and/or
    new column values of a sample (`sample_values`, committed in the same transaction)."""

    step: dict[str, Any] | None  # the row's columns; "sample_id" may be a SampleRef until written
    ended: bool  # the attempt's final row (else its `running` row)
    sample: SampleKey | None = None
    sample_values: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[SampleKey, int, int]:
        assert self.step is not None
        return self.step["sample_id"], self.step["index"], self.step["attempt"]


def sample_update(sample: SampleKey, values: dict[str, Any]) -> StepWrite:
    return StepWrite(None, False, sample, values)


@dataclass(slots=True)
class StepAttempt:
    """One attempt of one step of a sample: (sample, index, attempt) is unique in `steps`."""

    batch_id: int
    sample: SampleKey
    index: int
    attempt: int
    kind: str  # StepKind value
    enqueued_at: float
    started_at: float
    worker: str | None = None  # engine worker or environment slot
    request: dict[str, Any] | None = None
    task_run_id: str | None = None

    def _row(self, status: str) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "sample_id": self.sample, "index": self.index, "attempt": self.attempt,
                "kind": self.kind, "status": status, "enqueued_at": self.enqueued_at, "started_at": self.started_at,
                "worker": self.worker, "request": self.request, "task_run_id": self.task_run_id}

    def begun(self, sample_values: dict[str, Any] | None = None) -> StepWrite:
        """The attempt runs (`sample_values`: set on its sample at the same time, e.g. in_flight_step)."""
        return StepWrite(self._row(StepStatus.RUNNING), False, self.sample if sample_values else None, sample_values)

    def completed(self, outcome: StepOutcome, *, steps_done: int, finished_at: float | None = None,
                  sample_values: dict[str, Any] | None = None) -> StepWrite:
        """The attempt completed: its response, and the sample's progress (`steps_done` and, for an
        inference step, the worker that now holds its prefix) in the same transaction."""
        if outcome.worker:
            self.worker = outcome.worker
        row = self._row(StepStatus.COMPLETED)
        row.update({name: getattr(outcome, name) for name in _OUTCOME_FIELDS})
        row.update(response=outcome.response, finished_at=time.time() if finished_at is None else finished_at)
        values: dict[str, Any] = {"steps_done": steps_done, **(sample_values or {})}
        if self.kind == "inference" and self.worker:
            values["last_worker"] = self.worker
        return StepWrite(row, True, self.sample, values)

    def failed(self, error: str, finished_at: float | None = None) -> StepWrite:
        row = self._row(StepStatus.FAILED)
        row.update(error=error, finished_at=time.time() if finished_at is None else finished_at)
        return StepWrite(row, True)

    def cancelled(self, reason: str = "cancelled", finished_at: float | None = None) -> StepWrite:
        """Stopped from outside (the sample or the batch was cancelled): a failed attempt, for the history."""
        return self.failed(f"CancelledError: {reason}", finished_at)


# --- the request/response format -----------------------------------------------------------------------
def inference_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, priority: int | None, *,
                      messages_from: int, with_tools: bool) -> dict[str, Any]:
    start = messages_from if 0 <= messages_from <= len(messages) else 0
    record: dict[str, Any] = {"n_messages": len(messages), "priority": priority, "messages_from": start,
                              "messages": messages[start:]}
    if with_tools:
        record["tools"] = tools or []
    return record


def inference_response(message: dict[str, Any], finish_reason: str | None, response_id: str | None = None
                       ) -> dict[str, Any]:
    record: dict[str, Any] = {"message": message, "finish_reason": finish_reason}
    if response_id is not None:
        record["id"] = response_id
    return record


def environment_request(*, from_step: int | None = None, calls: list[dict[str, Any]] | None = None
                        ) -> dict[str, Any]:
    return {"from_step": from_step} if calls is None else {"calls": calls}


def environment_response(messages: list[dict[str, Any]], done: bool, *, tools: list[dict[str, Any]] | None = None,
                         tool_errors: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = {"messages": messages, "done": done}
    if tools is not None:
        record["tools"] = tools
    if tool_errors:
        record["tool_errors"] = tool_errors
    return record
