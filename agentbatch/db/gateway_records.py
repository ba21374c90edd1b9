"""Store writes of the gateways: samples that appear while a batch runs, and steps with the times
the gateway measured.

The built-in runner knows its samples before the batch starts and writes each step on the event
loop, so `Store` stamps times itself. The gateways learn of a sample from its first request and
write from a background thread (off the request path), many records per transaction (group commit),
so the times are passed in and every function takes the open session. The rows are
the same `samples` and `steps` rows, so `status`, `report` and `--compare` read gateway batches
like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from agentbatch.db.models import Sample, SampleStatus, Step, StepStatus
from agentbatch.db.store import StepOutcome

_OUTCOME_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s",
                   "decode_s", "engine_queue_s", "tool_calls")


@dataclass(eq=False, slots=True)
class SampleRef:
    """A sample row that requests may refer to before it is written: `id` is set when it is inserted
    (writes run in order, so every later write finds it)."""

    id: int | None = None

    @property
    def row_id(self) -> int:
        if self.id is None:
            raise RuntimeError("the sample row is not written yet")
        return self.id


@dataclass(frozen=True, slots=True)
class StepKey:
    """One step attempt: unique in the `steps` table."""

    sample: SampleRef
    index: int
    attempt: int = 1


@dataclass(slots=True)
class StepStart:
    """A step attempt as the gateway saw it begin."""

    batch_id: int
    key: StepKey
    kind: str
    enqueued_at: float
    started_at: float
    request: dict[str, Any] | None
    worker: str | None = None


def add_sample(session: Session, ref: SampleRef, batch_id: int, task_id: str,
               task: dict[str, Any] | None = None) -> int:
    """Append a sample to a running batch (index = one past the last); sets and returns its row id.
    It stays `pending` until admitted."""
    last = session.scalar(select(func.max(Sample.index)).where(Sample.batch_id == batch_id))
    sample = Sample(batch_id=batch_id, index=(-1 if last is None else last) + 1, task_id=task_id,
                    task=task or {}, status=SampleStatus.PENDING)
    session.add(sample)
    session.flush()
    ref.id = sample.id
    return sample.id


def admit_sample_at(session: Session, ref: SampleRef, at: float) -> None:
    """The sample runs from `at` (first admission), or again after it ended (answer, idle timeout)."""
    session.execute(update(Sample).where(Sample.id == ref.row_id).values(
        status=SampleStatus.RUNNING, admitted_at=func.coalesce(Sample.admitted_at, at), finished_at=None))


def end_sample(session: Session, ref: SampleRef, at: float, *, score: float | None,
               result: dict[str, Any] | None, error: str | None = None) -> None:
    """Mark a sample ended; a score or result given earlier is kept when none is given now."""
    sample = session.get_one(Sample, ref.row_id)
    sample.status = SampleStatus.FAILED if error else SampleStatus.COMPLETED
    sample.finished_at = at
    if score is not None:
        sample.score = score
    if result is not None:
        sample.result = {**(sample.result or {}), **result}
    if error is not None:
        sample.error = error


def begin_step(session: Session, start: StepStart) -> None:
    """Insert a `running` step attempt (one INSERT: the gateway numbers its own attempts)."""
    session.execute(insert(Step).values(
        batch_id=start.batch_id, sample_id=start.key.sample.row_id, index=start.key.index, attempt=start.key.attempt,
        kind=start.kind, status=StepStatus.RUNNING, enqueued_at=start.enqueued_at, started_at=start.started_at,
        worker=start.worker, request=start.request))


def _where(key: StepKey) -> Any:
    return (Step.sample_id == key.sample.row_id) & (Step.index == key.index) & (Step.attempt == key.attempt)


def complete_step(session: Session, key: StepKey, kind: str, outcome: StepOutcome, finished_at: float) -> None:
    """Mark the attempt completed at `finished_at` and advance its sample."""
    values: dict[str, Any] = {name: getattr(outcome, name) for name in _OUTCOME_FIELDS}
    values.update(status=StepStatus.COMPLETED, finished_at=finished_at, response=outcome.response)
    if outcome.worker:
        values["worker"] = outcome.worker
    session.execute(update(Step).where(_where(key)).values(**values))
    sample: dict[str, Any] = {"steps_done": Sample.steps_done + 1}
    if kind == "inference" and outcome.worker:  # that worker now holds the sample's prefix
        sample["last_worker"] = outcome.worker
    session.execute(update(Sample).where(Sample.id == key.sample.row_id).values(**sample))


def fail_step(session: Session, key: StepKey, error: str, finished_at: float) -> None:
    session.execute(update(Step).where(_where(key)).values(status=StepStatus.FAILED, finished_at=finished_at,
                                                          error=error))
