"""SQLAlchemy 2 models of the agentbatch store.

Timestamps are float seconds since the epoch (wall clock of the process that wrote them): cheap to
compare, exact enough for step timings, and identical on SQLite and PostgreSQL.

A `Step` row is one *attempt* of one step of a sample: (sample_id, index, attempt) is unique. A step
that was running when the process died is marked `abandoned` on resume and tried again as the next
attempt, so the history of every try stays visible.
"""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from agentbatch.db.base import Base


class BatchStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"  # finished; some samples failed
    FAILED = "failed"  # stopped by an error, by --fail-on-error, or every sample failed


class SampleStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


DONE_SAMPLES = (SampleStatus.COMPLETED, SampleStatus.FAILED)  # a sample's chain ended, scored or not
UNFINISHED_SAMPLES = (SampleStatus.PENDING, SampleStatus.RUNNING)


class StepStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"  # was running when the process died


# A step of an external-state environment cut short by a crash (db/leases.py flag_in_flight); the
# second once a user checked it and ran the sample again (`retry --in-flight-checked`).
MAY_HAVE_EXECUTED = "may have executed: the process died during this step of an environment with external state"
IN_FLIGHT_CHECKED = MAY_HAVE_EXECUTED + "; checked (retry --in-flight-checked)"


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32), default=BatchStatus.PENDING)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    flow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Refreshed by the running process (flows/progress.py); stale while `running` = the process died.
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    samples: Mapped[list[Sample]] = relationship(back_populates="batch", cascade="all, delete-orphan")


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (UniqueConstraint("batch_id", "index"), Index("ix_samples_task", "task_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[str] = mapped_column(String(200))
    task: Mapped[dict[str, Any]] = mapped_column(JSON)
    task_group: Mapped[str | None] = mapped_column(String(200), nullable=True)  # TaskSpec.group (suite, category)
    status: Mapped[str] = mapped_column(String(20), default=SampleStatus.PENDING)
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    admitted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # The process driving the sample and until when (db/leases.py); null when nobody drives it.
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Fencing token: +1 on every claim by a new owner; every write for the sample must carry the current one.
    lease_token: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # `agentbatch retry` resets
    # An external-state environment step executing now (set before, cleared on completion): left set
    # by a crash, the step may have executed without being recorded (db/leases.py flag_in_flight).
    in_flight_step: Mapped[int | None] = mapped_column(Integer, nullable=True)

    batch: Mapped[Batch] = relationship(back_populates="samples")


class Step(Base):
    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("sample_id", "index", "attempt"),
        Index("ix_steps_batch_status", "batch_id", "status"),
        # one completed attempt per step, whatever the interleaving of processes (migration 0003)
        Index("ux_steps_one_completion", "sample_id", "index", unique=True,
              sqlite_where=text("status = 'completed'"), postgresql_where=text("status = 'completed'")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    sample_id: Mapped[int] = mapped_column(ForeignKey("samples.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(20))  # StepKind value
    status: Mapped[str] = mapped_column(String(20), default=StepStatus.RUNNING)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    enqueued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)  # engine worker or env slot
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cached_prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    recomputed_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    output_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    prefill_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    decode_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    engine_queue_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # queue inside the engine
    tool_calls: Mapped[int | None] = mapped_column(Integer, nullable=True)
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    task_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


# The models' Core tables, for statements that skip the ORM (the writer's rows, fencing, gateway rows).
BATCHES = Batch.metadata.tables[Batch.__tablename__]
SAMPLES = Sample.metadata.tables[Sample.__tablename__]
STEPS = Step.metadata.tables[Step.__tablename__]


class Worker(Base):
    """An engine worker or environment host that served a batch (endpoint, settings, metrics)."""

    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("batch_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))  # "engine" | "environment"
    endpoint: Mapped[str | None] = mapped_column(String(500), nullable=True)
    settings: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
