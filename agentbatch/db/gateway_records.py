"""Store writes of the gateways: samples that appear while a batch runs, and steps with the times
the gateway measured.

The built-in runner knows its samples before the batch starts and writes each step on the event
loop, so `Store` stamps times itself. The gateways learn of a sample from its first request and
write from a background thread (off the request path), so the times are passed in. The rows are
the same `samples` and `steps` rows, so `status`, `report` and `--compare` read gateway batches
like any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update

from agentbatch.db.models import Sample, SampleStatus, Step, StepStatus
from agentbatch.db.store import StepOutcome, Store

_OUTCOME_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s",
                   "decode_s", "engine_queue_s", "tool_calls")


@dataclass(slots=True)
class StepStart:
    """A step attempt as the gateway saw it begin."""

    batch_id: int
    sample_id: int
    index: int
    kind: str
    enqueued_at: float
    started_at: float
    request: dict[str, Any] | None
    worker: str | None = None


def add_sample(store: Store, batch_id: int, task_id: str, task: dict[str, Any] | None = None) -> int:
    """Append a sample to a running batch (index = one past the last); returns its row id. It stays
    `pending` until admitted."""
    with store.session() as s, s.begin():
        last = s.scalar(select(func.max(Sample.index)).where(Sample.batch_id == batch_id))
        sample = Sample(batch_id=batch_id, index=(-1 if last is None else last) + 1, task_id=task_id,
                        task=task or {}, status=SampleStatus.PENDING)
        s.add(sample)
        s.flush()
        return sample.id


def admit_sample_at(store: Store, sample_id: int, at: float) -> None:
    """The sample runs from `at` (first admission), or again after it ended (answer, idle timeout)."""
    with store.session() as s, s.begin():
        sample = s.get_one(Sample, sample_id)
        sample.status = SampleStatus.RUNNING
        sample.admitted_at = sample.admitted_at or at
        sample.finished_at = None


def end_sample(store: Store, sample_id: int, at: float, *, score: float | None, result: dict[str, Any] | None,
               error: str | None = None) -> None:
    """Mark a sample ended; a score or result given earlier is kept when none is given now."""
    with store.session() as s, s.begin():
        sample = s.get_one(Sample, sample_id)
        sample.status = SampleStatus.FAILED if error else SampleStatus.COMPLETED
        sample.finished_at = at
        if score is not None:
            sample.score = score
        if result is not None:
            sample.result = {**(sample.result or {}), **result}
        if error is not None:
            sample.error = error


def begin_step(store: Store, start: StepStart) -> int:
    """Insert a `running` step attempt (attempt = one more than the step's earlier attempts)."""
    with store.session() as s, s.begin():
        prev = s.scalar(select(func.max(Step.attempt)).where(Step.sample_id == start.sample_id,
                                                               Step.index == start.index))
        step = Step(batch_id=start.batch_id, sample_id=start.sample_id, index=start.index, kind=start.kind,
                    status=StepStatus.RUNNING, attempt=(prev or 0) + 1, enqueued_at=start.enqueued_at,
                    started_at=start.started_at, worker=start.worker, request=start.request)
        s.add(step)
        s.flush()
        return step.id


def complete_step(store: Store, step_id: int, outcome: StepOutcome, finished_at: float) -> None:
    """Mark the attempt completed at `finished_at` and advance its sample, in one transaction."""
    with store.session() as s, s.begin():
        step = s.get_one(Step, step_id)
        step.status = StepStatus.COMPLETED
        step.finished_at = finished_at
        step.response = outcome.response
        for name in _OUTCOME_FIELDS:
            setattr(step, name, getattr(outcome, name))
        if outcome.worker:
            step.worker = outcome.worker
        values: dict[str, Any] = {"steps_done": Sample.steps_done + 1}
        if step.kind == "inference" and step.worker:
            values["last_worker"] = step.worker
        s.execute(update(Sample).where(Sample.id == step.sample_id).values(**values))


def fail_step(store: Store, step_id: int, error: str, finished_at: float | None = None) -> None:
    with store.session() as s, s.begin():
        step = s.get_one(Step, step_id)
        step.status = StepStatus.FAILED
        step.finished_at = finished_at if finished_at is not None else time.time()
        step.error = error
