"""Time series of engine workers' scraped metrics (vLLM `/metrics`), one row per worker per scrape.

`workers.metrics` keeps only the latest snapshot; reports that plot cache hits or KV usage over a
batch read this table. Counters are cumulative since the worker started (as vLLM reports them).
Created by migration 0002_vllm_metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from agentbatch.db import models as _models  # noqa: F401  (the batches table its rows point at)
from agentbatch.db.base import Base


class WorkerMetricSample(Base):
    __tablename__ = "worker_metrics"
    __table_args__ = (Index("ix_worker_metrics_batch_worker_t", "batch_id", "worker", "t"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    worker: Mapped[str] = mapped_column(String(200))
    t: Mapped[float] = mapped_column(Float)  # wall clock of the scrape
    prefix_cache_queries: Mapped[float] = mapped_column(Float, default=0.0)  # tokens, cumulative
    prefix_cache_hits: Mapped[float] = mapped_column(Float, default=0.0)  # tokens, cumulative
    kv_cache_usage: Mapped[float | None] = mapped_column(Float, nullable=True)  # 0..1
    running: Mapped[int] = mapped_column(Integer, default=0)
    waiting: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[float] = mapped_column(Float, default=0.0)  # cumulative
    prompt_tokens: Mapped[float] = mapped_column(Float, default=0.0)  # cumulative
    generation_tokens: Mapped[float] = mapped_column(Float, default=0.0)  # cumulative


_FIELDS = ("prefix_cache_queries", "prefix_cache_hits", "kv_cache_usage", "running", "waiting",
           "preemptions", "prompt_tokens", "generation_tokens")


def insert_worker_metrics(store: Any, batch_id: int, snapshots: Iterable[Any]) -> int:
    """Append snapshots (objects with `name`, `scraped_at` and the metric fields) in one transaction."""
    rows = [
        WorkerMetricSample(batch_id=batch_id, worker=m.name, t=m.scraped_at, **{f: getattr(m, f) for f in _FIELDS})
        for m in snapshots
    ]
    if rows:
        with store.session() as s, s.begin():
            s.add_all(rows)
    return len(rows)


def worker_metrics(store: Any, batch_id: int, worker: str | None = None) -> list[dict[str, Any]]:
    """The series of a batch (optionally one worker), ordered by worker then time, as plain dicts."""
    q = select(WorkerMetricSample).where(WorkerMetricSample.batch_id == batch_id)
    if worker is not None:
        q = q.where(WorkerMetricSample.worker == worker)
    with store.session() as s:
        rows = s.scalars(q.order_by(WorkerMetricSample.worker, WorkerMetricSample.t, WorkerMetricSample.id))
        return [{"worker": r.worker, "t": r.t, **{f: getattr(r, f) for f in _FIELDS}} for r in rows]
