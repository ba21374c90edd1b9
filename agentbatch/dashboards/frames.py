"""Load one batch from the store as pandas DataFrames.

Only the columns the analytics need are read (request/response JSON can be large). Times stay
float epoch seconds, as stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import make_url, select

from agentbatch.db.models import Sample, Step, Worker
from agentbatch.db.store import Store, UnknownBatch

SAMPLE_COLUMNS = ("id", "index", "task_id", "status", "steps_done", "score", "admitted_at", "finished_at",
                  "last_worker", "error", "task_group")
STEP_COLUMNS = ("id", "sample_id", "index", "kind", "status", "attempt", "enqueued_at", "started_at",
                "finished_at", "worker", "prompt_tokens", "cached_prompt_tokens", "recomputed_tokens",
                "output_tokens", "prefill_s", "decode_s", "engine_queue_s", "tool_calls")
_FLOAT_STEP_COLUMNS = ("enqueued_at", "started_at", "finished_at", "prefill_s", "decode_s", "engine_queue_s")
_NUMERIC_STEP_COLUMNS = ("prompt_tokens", "cached_prompt_tokens", "recomputed_tokens", "output_tokens",
                         "tool_calls")


@dataclass
class BatchData:
    batch_id: int
    name: str
    status: str
    config: dict[str, Any]
    created_at: float
    started_at: float | None
    finished_at: float | None
    flow_run_id: str | None
    samples: pd.DataFrame  # one row per sample
    steps: pd.DataFrame  # one row per step attempt
    workers: pd.DataFrame = field(default_factory=pd.DataFrame)  # name, kind
    heartbeat_at: float | None = None  # last beat of the running process (flows/progress.py)
    source: str = ""  # the store it came from, when not the report's own store (a compared batch)

    @property
    def title(self) -> str:
        """"batch 3", or "batch 3@runs/b.sqlite" for a batch of another store."""
        return f"batch {self.batch_id}" + (f"@{self.source}" if self.source else "")

    @property
    def key(self) -> str:
        """The title as a name for HTML ids and files: digits, letters and dashes."""
        return re.sub(r"[^A-Za-z0-9]+", "-", self.title.removeprefix("batch ")).strip("-")


def _normalize(samples: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Same dtypes whatever the driver: NULLs come back as None in object columns on some."""
    for col in ("admitted_at", "finished_at", "score", "steps_done"):
        samples[col] = pd.to_numeric(samples[col], errors="coerce").astype("float64")
    for col in _FLOAT_STEP_COLUMNS + _NUMERIC_STEP_COLUMNS:
        steps[col] = pd.to_numeric(steps[col], errors="coerce").astype("float64")
    for col in ("task_id", "status", "last_worker", "error", "task_group"):
        samples[col] = samples[col].astype(object)
    for col in ("kind", "status", "worker"):
        steps[col] = steps[col].astype(object)


def batch_from_frames(samples: pd.DataFrame, steps: pd.DataFrame, *, config: dict[str, Any] | None = None,
                      name: str = "batch", batch_id: int = 0, status: str = "completed") -> BatchData:
    """A BatchData from frames with the store's column names (e.g. a virtual-time replay), so the
    same analytics and report apply without a store. Missing optional columns are filled with NULL."""
    samples = samples.copy()
    steps = steps.copy()
    for col in SAMPLE_COLUMNS:
        if col not in samples:
            samples[col] = None
    for col in STEP_COLUMNS:
        if col not in steps:
            steps[col] = None
    samples, steps = samples[list(SAMPLE_COLUMNS)], steps[list(STEP_COLUMNS)]
    _normalize(samples, steps)
    return BatchData(batch_id=batch_id, name=name, status=status, config=dict(config or {}), created_at=0.0,
                     started_at=None, finished_at=None, flow_run_id=None, samples=samples, steps=steps,
                     workers=pd.DataFrame({"name": pd.Series(dtype=object), "kind": pd.Series(dtype=object)}))


def _read(store: Store, stmt: Any) -> pd.DataFrame:
    with store.engine.connect() as conn:
        return pd.read_sql(stmt, conn)


def load_batch(store: Store, batch_id: int) -> BatchData:
    batch = store.get_batch(batch_id)
    if batch is None:
        raise UnknownBatch(batch_id, make_url(store.url).render_as_string(hide_password=True))  # as given, not the engine's
    samples = _read(store, select(*(Sample.__table__.c[c] for c in SAMPLE_COLUMNS))
                    .where(Sample.batch_id == batch_id).order_by(Sample.index))
    steps = _read(store, select(*(Step.__table__.c[c] for c in STEP_COLUMNS))
                  .where(Step.batch_id == batch_id).order_by(Step.id))
    workers = _read(store, select(Worker.name, Worker.kind).where(Worker.batch_id == batch_id))
    _normalize(samples, steps)
    return BatchData(
        batch_id=batch.id,
        name=batch.name,
        status=batch.status,
        config=dict(batch.config or {}),
        created_at=batch.created_at,
        started_at=batch.started_at,
        finished_at=batch.finished_at,
        flow_run_id=batch.flow_run_id,
        samples=samples,
        steps=steps,
        workers=workers,
        heartbeat_at=getattr(batch, "heartbeat_at", None),
    )
