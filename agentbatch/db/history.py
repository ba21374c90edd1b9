"""Runs of a suite: which batches ran the same benchmark, what started them, and the priors they used.

A **suite** is identified by (workload kind, workload params, the set of task ids): two batches with
the same suite key ran the same tasks, whatever engine, checkpoint or policies they used. One row of
`suite_runs` per batch holds its key, the deployment that started it (scheduled evals), its
model/checkpoint tag, and which chain-length priors it was admitted with. Rows are written when a
batch starts (`suite_priors`) and filled in for older batches on first use (`ensure_suite_rows`).

Created by migration 0006_suite_runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import ForeignKey, Integer, String, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Mapped, mapped_column

from agentbatch.db import models as _models  # noqa: F401  (the batches table its rows point at)
from agentbatch.db.base import Base
from agentbatch.db.models import Batch, BatchStatus, Sample, SampleStatus

if TYPE_CHECKING:
    from agentbatch.db.store import Store

log = logging.getLogger(__name__)
SUITE_KEY_CHARS = 16
PRIOR_RUNS = 10  # the suite's most recent earlier runs its priors are averaged over
FINISHED = (BatchStatus.COMPLETED, "completed_with_failures")


class SuiteRun(Base):
    __tablename__ = "suite_runs"

    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    suite_key: Mapped[str] = mapped_column(String(32), index=True)
    workload_kind: Mapped[str] = mapped_column(String(200))
    tasks: Mapped[int] = mapped_column(Integer)
    tag: Mapped[str | None] = mapped_column(String(200), nullable=True)
    deployment: Mapped[str | None] = mapped_column(String(200), nullable=True)  # "flow/deployment"
    deployment_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    priors_source: Mapped[str | None] = mapped_column(String(20), nullable=True)  # "suite" | "task_ids"
    priors_runs: Mapped[int] = mapped_column(Integer, default=0)
    priors_tasks: Mapped[int] = mapped_column(Integer, default=0)


def suite_key(workload_kind: str, params: dict[str, Any], task_ids: Iterable[str]) -> str:
    """A stable short hash of (workload kind, params, sorted task ids)."""
    ident = {"kind": workload_kind, "params": params, "tasks": sorted(set(task_ids))}
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:SUITE_KEY_CHARS]


def config_suite_key(config: dict[str, Any], task_ids: Iterable[str]) -> str:
    workload = config.get("workload") or {}
    params = {k: v for k, v in (workload.get("params") or {}).items() if k != "batch_label"}  # names one run's sandboxes
    return suite_key(str(workload.get("kind", "")), params, task_ids)


@dataclass
class Priors:
    """Expected chain length (steps) per task id, and where it came from."""

    lengths: dict[str, float] = field(default_factory=dict)
    source: str | None = None  # "suite": earlier runs of the suite; "task_ids": other batches of the tasks
    runs: int = 0  # batches the lengths were averaged over
    suite_key: str | None = None
    tasks: int = 0  # task ids with a prior

    def describe(self) -> str:
        if not self.tasks:
            return "none (no earlier run of this suite or of these task ids)"
        runs = f"{self.runs} earlier run{'s' if self.runs != 1 else ''}"
        where = f"of suite {self.suite_key}" if self.source == "suite" else "with the same task ids (other suites)"
        return f"chain lengths of {self.tasks} task(s) from {runs} {where}"


def _task_ids(store: Store, batch_id: int) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(Sample.task_id).where(Sample.batch_id == batch_id)))


def ensure_suite_row(store: Store, batch_id: int) -> SuiteRun:
    """The batch's row, written from its config and task ids when missing."""
    with store.session() as s:
        row = s.get(SuiteRun, batch_id)
        if row is not None:
            return row
        batch = s.get_one(Batch, batch_id)
        config = dict(batch.config or {})
    ids = _task_ids(store, batch_id)
    row = SuiteRun(batch_id=batch_id, suite_key=config_suite_key(config, ids),
                   workload_kind=str((config.get("workload") or {}).get("kind", "")), tasks=len(ids))
    try:
        with store.session() as s, s.begin():
            if s.get(SuiteRun, batch_id) is None:  # another process may have written it meanwhile
                s.add(row)
    except DBAPIError as exc:  # a read-only store: the key is still right, just not kept
        log.debug("cannot record the suite of batch %s: %s", batch_id, exc)
    return row


def ensure_suite_rows(store: Store) -> int:
    """Write the rows of batches that have none (batches of older versions); returns how many."""
    with store.session() as s:
        missing = list(s.scalars(select(Batch.id).where(Batch.id.not_in(select(SuiteRun.batch_id)))))
    for batch_id in missing:
        ensure_suite_row(store, batch_id)
    return len(missing)


def record_origin(store: Store, batch_id: int, *, tag: str | None = None, deployment: str | None = None,
                  deployment_id: str | None = None) -> None:
    """Note what started a batch: its checkpoint/model tag and the Prefect deployment."""
    ensure_suite_row(store, batch_id)
    with store.session() as s, s.begin():
        row = s.get_one(SuiteRun, batch_id)
        row.tag, row.deployment, row.deployment_id = tag, deployment, deployment_id


def suite_row(store: Store, batch_id: int) -> SuiteRun | None:
    with store.session() as s:
        return s.get(SuiteRun, batch_id)


def suite_runs(store: Store, key: str) -> list[SuiteRun]:
    """The suite's runs, oldest first."""
    with store.session() as s:
        return list(s.scalars(select(SuiteRun).where(SuiteRun.suite_key == key).order_by(SuiteRun.batch_id)))


def previous_run(store: Store, batch_id: int) -> int | None:
    """The latest finished run of the batch's suite created before it, if any."""
    key = ensure_suite_row(store, batch_id).suite_key
    q = (select(func.max(SuiteRun.batch_id)).join(Batch, Batch.id == SuiteRun.batch_id)
         .where(SuiteRun.suite_key == key, SuiteRun.batch_id < batch_id, Batch.status.in_(FINISHED)))
    with store.session() as s:
        return s.scalar(q)


@dataclass
class SuiteInfo:
    suite_key: str
    workload_kind: str
    tasks: int
    runs: int
    last_batch: int
    names: list[str]
    deployments: list[str]


def list_suites(store: Store) -> list[SuiteInfo]:
    """Every suite in the store, the most recently run first."""
    ensure_suite_rows(store)
    with store.session() as s:
        rows = s.execute(select(SuiteRun, Batch.name).join(Batch, Batch.id == SuiteRun.batch_id)
                         .order_by(SuiteRun.batch_id)).all()
    out: dict[str, SuiteInfo] = {}
    for run, name in rows:
        info = out.setdefault(run.suite_key, SuiteInfo(run.suite_key, run.workload_kind, run.tasks, 0, 0, [], []))
        info.runs += 1
        info.last_batch = run.batch_id
        if name not in info.names:
            info.names.append(name)
        if run.deployment and run.deployment not in info.deployments:
            info.deployments.append(run.deployment)
    return sorted(out.values(), key=lambda i: -i.last_batch)


def resolve_suites(store: Store, ref: str) -> list[str]:
    """Suite keys named by `ref`: a suite key (or a prefix of one), a deployment name ("deployment"
    or "flow/deployment"), or a batch name."""
    suites = list_suites(store)
    by_key = [i.suite_key for i in suites if i.suite_key.startswith(ref.lower())] if len(ref) >= 4 else []
    if by_key:
        return by_key
    named = [i.suite_key for i in suites
             if ref in i.names or any(ref in (d, d.split("/", 1)[-1]) for d in i.deployments)]
    return named


def _mean_lengths(store: Store, batch_ids: list[int], task_ids: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(0, len(task_ids), 500):  # short IN lists for SQLite's variable limit
        q = (select(Sample.task_id, func.avg(Sample.steps_done))
             .where(Sample.batch_id.in_(batch_ids), Sample.task_id.in_(task_ids[i:i + 500]),
                    Sample.status == SampleStatus.COMPLETED)
             .group_by(Sample.task_id))
        with store.session() as s:
            out.update({t: float(avg) for t, avg in s.execute(q)})
    return out


def _contributing_batches(store: Store, task_ids: list[str], exclude_batch_id: int) -> int:
    batches: set[int] = set()
    for i in range(0, len(task_ids), 500):
        q = (select(Sample.batch_id).distinct()
             .where(Sample.task_id.in_(task_ids[i:i + 500]), Sample.batch_id != exclude_batch_id,
                    Sample.status == SampleStatus.COMPLETED))
        with store.session() as s:
            batches.update(s.scalars(q))
    return len(batches)


def suite_priors(store: Store, batch_id: int, task_ids: Iterable[str]) -> Priors:
    """Chain-length priors for a batch's tasks, recorded with the batch.

    From the suite's last PRIOR_RUNS earlier finished runs when it has any; otherwise from any other
    batch's completed samples of the same task ids (the store-wide fallback)."""
    ids = sorted(set(task_ids))
    key = ensure_suite_row(store, batch_id).suite_key
    q = (select(SuiteRun.batch_id).join(Batch, Batch.id == SuiteRun.batch_id)
         .where(SuiteRun.suite_key == key, SuiteRun.batch_id < batch_id, Batch.status.in_(FINISHED))
         .order_by(SuiteRun.batch_id.desc()).limit(PRIOR_RUNS))
    with store.session() as s:
        earlier = list(s.scalars(q))
    priors = Priors(suite_key=key)
    if earlier and ids:
        priors.lengths = _mean_lengths(store, earlier, ids)
        priors.source, priors.runs = "suite", len(earlier)
    if not priors.lengths and ids:
        priors.lengths = store.prior_chain_lengths(ids, exclude_batch_id=batch_id)
        if priors.lengths:
            priors.source, priors.runs = "task_ids", _contributing_batches(store, ids, batch_id)
    priors.tasks = len(priors.lengths)
    with store.session() as s, s.begin():
        row = s.get_one(SuiteRun, batch_id)
        row.priors_source, row.priors_runs, row.priors_tasks = priors.source, priors.runs, priors.tasks
    return priors


def priors_used(store: Store, batch_id: int) -> Priors | None:
    """What `suite_priors` recorded for the batch (the count of task ids, not the lengths); None
    when the batch never started."""
    row = suite_row(store, batch_id)
    if row is None:
        return None
    return Priors(source=row.priors_source, runs=row.priors_runs, suite_key=row.suite_key, tasks=row.priors_tasks)
