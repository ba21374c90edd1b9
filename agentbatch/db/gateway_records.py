"""The gateways' sample rows: samples that appear while a batch runs, admitted and ended by it.

The built-in runner knows its samples before the batch starts (`Store.create_batch`). A gateway
learns of a sample from its first request, so it appends the row then, and admits and ends it as the
harness goes. These are jobs of the one writer (`db/writer.py`): they run in its thread, in order with
the step attempts (which may refer to the row before it is written, through a `SampleRef`), many per
transaction, with the times the gateway measured. The rows are the same `samples` rows, so `status`,
`report` and `--compare` read gateway batches like any other.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from agentbatch.db.models import BATCHES, SAMPLES, SampleStatus
from agentbatch.db.step_records import SampleRef

# Built once: a gateway runs them for every sample it sees, and building a statement cost more CPU
# than executing it.
_LOCK_BATCH = select(BATCHES.c.id).where(BATCHES.c.id == bindparam("batch")).with_for_update()
_LAST_INDEX = select(func.max(SAMPLES.c.index)).where(SAMPLES.c.batch_id == bindparam("batch"))
_ADD = insert(SAMPLES).returning(SAMPLES.c.id)
_ADMIT = update(SAMPLES).where(SAMPLES.c.id == bindparam("sample")).values(
    status=SampleStatus.RUNNING, admitted_at=func.coalesce(SAMPLES.c.admitted_at, bindparam("at")), finished_at=None)


def add_sample(session: Session, ref: SampleRef, batch_id: int, task_id: str,
               task: dict[str, Any] | None = None) -> int:
    """Append a sample to a running batch (index = one past the last); sets and returns its row id.
    It stays `pending` until admitted. Under a lock on the batch row: gateway processes that serve one
    batch together append rows at the same time, and the index is unique in the batch. Written as
    one INSERT (no ORM unit of work): a gateway appends a row for every sample it sees."""
    conn = session.connection()  # Core statements: no ORM execution layer per statement
    conn.execute(_LOCK_BATCH, {"batch": batch_id})
    last = conn.execute(_LAST_INDEX, {"batch": batch_id}).scalar()
    ref.id = conn.execute(_ADD, {"batch_id": batch_id, "index": (-1 if last is None else last) + 1, "task_id": task_id,
                                 "task": task or {}, "status": SampleStatus.PENDING}).scalar_one()
    return ref.id


def admit_sample_at(session: Session, ref: SampleRef, at: float) -> None:
    """The sample runs from `at` (first admission), or again after it ended (answer, idle timeout)."""
    session.connection().execute(_ADMIT, {"sample": ref.row_id, "at": at})


def end_sample(session: Session, ref: SampleRef, at: float, *, score: float | None,
               result: dict[str, Any] | None, error: str | None = None) -> None:
    """Mark a sample ended; a score or result given earlier is kept when none is given now."""
    values: dict[str, Any] = {"status": SampleStatus.FAILED if error else SampleStatus.COMPLETED, "finished_at": at}
    if score is not None:
        values["score"] = score
    conn = session.connection()
    if result is not None:
        earlier = conn.execute(select(SAMPLES.c.result).where(SAMPLES.c.id == ref.row_id)).scalar_one()
        values["result"] = {**(earlier or {}), **result}
    if error is not None:
        values["error"] = error
    conn.execute(update(SAMPLES).where(SAMPLES.c.id == ref.row_id).values(values))
