"""The store API: everything agentbatch writes to or reads from its SQL database.

Each write method is one transaction. Step attempts and the samples' progress are not written here
but by the one group-commit writer (`db/writer.py`, records from `db/step_records.py`): an attempt is
completed in the transaction that also advances its sample's `steps_done`, so after a crash a step is
either completed with its response or not completed at all. This class reads them back (resume,
status) and marks the attempts a dead process left `running` as abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Executable,
    Float,
    Row,
    bindparam,
    case,
    event,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased, sessionmaker

from agentbatch.db.engine import check_readable, make_engine, migrate, resolve_url
from agentbatch.db.fencing import still_held
from agentbatch.db.models import (
    IN_FLIGHT_CHECKED,
    MAY_HAVE_EXECUTED,
    SAMPLES,
    UNFINISHED_SAMPLES,
    Batch,
    BatchStatus,
    Sample,
    SampleStatus,
    Step,
    StepStatus,
    Worker,
)
from agentbatch.protocols.secrets import redact_text, redact_value


def _dml(session: Session, statement: Executable) -> CursorResult[Any]:
    """An UPDATE or DELETE; its result is a CursorResult (which has `rowcount`), though typed a Result."""
    return cast(CursorResult[Any], session.execute(statement))


@dataclass(slots=True)
class StepHistory:
    completed: list[Step] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)  # step index -> highest attempt recorded
    latest: dict[int, Step] = field(default_factory=dict)  # step index -> its latest attempt


class UnknownBatch(LookupError):
    """No batch with this id in the store."""

    def __init__(self, batch_id: int, url: str = "") -> None:
        where = f" in {url}" if url else ""
        super().__init__(f"no batch with id {batch_id}{where}")
        self.batch_id = batch_id


@dataclass(slots=True)
class SampleProgress:
    """A batch's samples in aggregate (`sample_progress`): what `status` shows without reading each row."""

    counts: dict[str, int] = field(default_factory=dict)  # samples per status
    first_admitted_at: float | None = None
    last_finished_at: float | None = None
    completed_mean_steps: float | None = None  # mean steps_done of the completed samples

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class GroupTally:
    samples: int
    scored: int  # samples with a score (NaN is no score)
    mean: float | None  # of the scored ones


@dataclass(frozen=True, slots=True)
class RemainingSteps:
    samples: int  # unfinished samples
    with_history: int  # of them, those whose task id completed in another batch
    steps: float  # steps left in all
    longest: float  # steps left on the longest chain



def chain_length_means(session: Session, task_ids: Collection[str], exclude_batch_id: int) -> dict[str, float]:
    """Mean recorded chain length (steps) of each of `task_ids` over the completed samples of the other
    batches, in the caller's transaction."""
    rows = session.connection().execute(_CHAIN_LENGTH_MEANS, {"ids": list(task_ids), "batch": exclude_batch_id})
    return {task_id: float(avg) for task_id, avg in rows}


# Built once, run on the session's connection (Core): a gateway runs it for every new sample it sees.
_CHAIN_LENGTH_MEANS = (
    select(SAMPLES.c.task_id, func.avg(SAMPLES.c.steps_done))
    .where(SAMPLES.c.task_id.in_(bindparam("ids", expanding=True)), SAMPLES.c.batch_id != bindparam("batch"),
           SAMPLES.c.status == SampleStatus.COMPLETED)
    .group_by(SAMPLES.c.task_id)
)


class Store:
    def __init__(self, url: str | None = None, *, create: bool = True, read_only: bool = False) -> None:
        """`read_only`: for commands that only read (status, report): never creates a file, a table
        or a migration; raises StoreUnavailable when there is no up-to-date store at the URL."""
        self.url = resolve_url(url)
        self.engine = make_engine(self.url, read_only=read_only)
        if read_only:
            check_readable(self.engine)
        elif create:
            migrate(self.engine)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self._stall_bound_ms: int | None = None

    def session(self) -> Session:
        return self._session()

    def close(self) -> None:
        self.engine.dispose()

    # --- batches -------------------------------------------------------------------------------
    def create_batch(self, name: str, config: dict[str, Any], tasks: Sequence[tuple[Any, ...]]) -> int:
        """Create a batch and its samples (one per (task_id, task data[, group])) in one transaction."""
        now = time.time()
        with self.session() as s, s.begin():
            batch = Batch(name=name, config=config, status=BatchStatus.PENDING, created_at=now)
            s.add(batch)
            s.flush()
            s.add_all(
                Sample(batch_id=batch.id, index=i, task_id=task_id, task=data, status=SampleStatus.PENDING,
                       task_group=group[0] if group else None)
                for i, (task_id, data, *group) in enumerate(tasks)
            )
            return batch.id

    def get_batch(self, batch_id: int) -> Batch | None:
        with self.session() as s:
            return s.get(Batch, batch_id)

    def set_batch_config(self, batch_id: int, config: dict[str, Any]) -> None:
        """Replace a batch's stored config (the scheduling a run chose, flows/policy_choice.py)."""
        with self.session() as s, s.begin():
            s.get_one(Batch, batch_id).config = config

    def list_batches(self) -> list[Batch]:
        with self.session() as s:
            return list(s.scalars(select(Batch).order_by(Batch.id)))

    def mark_batch_running(self, batch_id: int, flow_run_id: str | None = None) -> None:
        with self.session() as s, s.begin():
            batch = s.get_one(Batch, batch_id)
            batch.status = BatchStatus.RUNNING
            batch.started_at = batch.started_at or time.time()
            batch.finished_at = None
            if flow_run_id:
                batch.flow_run_id = flow_run_id
            batch.heartbeat_at = time.time()

    def heartbeat(self, batch_id: int) -> None:
        """The running process is alive (`status` calls a running batch with a stale beat crashed)."""
        with self.session() as s, s.begin():
            s.execute(update(Batch).where(Batch.id == batch_id).values(heartbeat_at=time.time()))

    def finish_batch(self, batch_id: int, status: BatchStatus, error: str | None = None) -> None:
        with self.session() as s, s.begin():
            batch = s.get_one(Batch, batch_id)
            batch.status = status
            batch.finished_at = time.time()
            batch.error = error

    # --- samples -------------------------------------------------------------------------------
    def samples(self, batch_id: int, statuses: Iterable[str] | None = None) -> list[Sample]:
        q = select(Sample).where(Sample.batch_id == batch_id)
        if statuses is not None:
            q = q.where(Sample.status.in_(list(statuses)))
        with self.session() as s:
            return list(s.scalars(q.order_by(Sample.index)))

    def finish_sample(
        self, sample_id: int, *, score: float | None, result: dict[str, Any] | None, error: str | None = None,
        token: int | None = None,
    ) -> bool:
        """Mark a sample ended. `token`: only while the sample's row carries this lease token (checked in
        the same transaction, `db/fencing.py`); returns False, writing nothing, when it moved on."""
        with self.session() as s, s.begin():
            if token is not None and not still_held(s.connection(), {sample_id: token}):
                return False
            sample = s.get_one(Sample, sample_id)
            sample.status = SampleStatus.FAILED if error else SampleStatus.COMPLETED
            sample.score = score
            sample.result = result
            sample.error = error
            sample.finished_at = time.time()
        return True

    def reset_failed(self, batch_id: int, hold: str | None = None, release: Collection[int] = ()) -> int:
        """Set the batch's failed samples to run again (`agentbatch retry`); their completed steps and
        every earlier attempt stay. A sample whose error starts with `hold` stays failed unless its id
        is in `release`; a released one's steps flagged "may have executed" are marked checked (its
        environment is not asked again). Returns how many."""
        failed = (Sample.batch_id == batch_id) & (Sample.status == SampleStatus.FAILED)
        held = true() if hold is None else (Sample.error.is_(None) | ~Sample.error.startswith(hold, autoescape=True)
                                            | Sample.id.in_(list(release)))
        with self.session() as s, s.begin():
            checked = list(s.scalars(select(Sample.id).where(failed, held, Sample.id.in_(list(release)))))
            if checked:
                s.execute(update(Step).where(Step.sample_id.in_(checked), Step.error == MAY_HAVE_EXECUTED)
                          .values(error=IN_FLIGHT_CHECKED))
            result = _dml(s,
                update(Sample)
                .where(failed, held)
                .values(status=SampleStatus.PENDING, error=None, score=None, result=None, finished_at=None,
                        retries=Sample.retries + 1)
            )
            return result.rowcount or 0

    def bound_stalled_transactions(self, seconds: float) -> None:
        """PostgreSQL: the server ends any transaction of this store left idle for `seconds` (at least 1 s;
        the shortest bound asked for holds), releasing its row locks. A process stopped inside one
        (SIGSTOP, a debugger, a frozen VM) would otherwise keep the rows that a process taking over its
        expired sample leases must lock; that process's next statement fails instead."""
        if self.engine.dialect.name != "postgresql":
            return
        if self._stall_bound_ms is None:
            event.listen(self.engine, "begin", self._bound_stall)
        ms = max(1000, int(seconds * 1000))
        self._stall_bound_ms = ms if self._stall_bound_ms is None else min(ms, self._stall_bound_ms)

    def _bound_stall(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {self._stall_bound_ms}")

    def prior_chain_lengths(self, task_ids: Iterable[str], exclude_batch_id: int) -> dict[str, float]:
        """Mean recorded chain length (steps) of each task id over earlier completed samples."""
        ids = list(set(task_ids))
        out: dict[str, float] = {}
        for i in range(0, len(ids), 500):  # keep IN lists short for SQLite's variable limit
            with self.session() as s:
                out.update(chain_length_means(s, ids[i : i + 500], exclude_batch_id))
        return out

    def status_counts(self, batch_id: int) -> dict[str, int]:
        q = select(Sample.status, func.count()).where(Sample.batch_id == batch_id).group_by(Sample.status)
        with self.session() as s:
            return {status: n for status, n in s.execute(q)}

    # --- aggregates for `status`: one query each, whatever the batch's size ---------------------
    def sample_progress(self, batch_id: int) -> SampleProgress:
        q = (select(Sample.status, func.count(), func.min(Sample.admitted_at), func.max(Sample.finished_at),
                    func.avg(Sample.steps_done))
             .where(Sample.batch_id == batch_id).group_by(Sample.status))
        out = SampleProgress()
        with self.session() as s:
            for status, n, first, last, mean_steps in s.execute(q):
                out.counts[status] = n
                out.first_admitted_at = _extreme(min, out.first_admitted_at, first)
                out.last_finished_at = _extreme(max, out.last_finished_at, last)
                if status == SampleStatus.COMPLETED and mean_steps is not None:
                    out.completed_mean_steps = float(mean_steps)
        return out

    def step_counts(self, batch_id: int) -> dict[str, int]:
        """Step attempts per status (an index-only scan of ix_steps_batch_status)."""
        q = select(Step.status, func.count()).where(Step.batch_id == batch_id).group_by(Step.status)
        with self.session() as s:
            return {status: n for status, n in s.execute(q)}

    def remaining_steps(self, batch_id: int, fallback_mean: float | None) -> RemainingSteps:
        """Steps left over the batch's unfinished samples, each max(expected chain length - steps done, 1).
        The expected length of a sample is its task id's mean over other batches' completed samples,
        else `fallback_mean` (the caller's: this batch's completed samples), else steps done + 1 (a
        lower bound)."""
        unfinished = (Sample.batch_id == batch_id) & Sample.status.in_(UNFINISHED_SAMPLES)
        prior, mine = aliased(Sample), aliased(Sample)
        hist = (select(prior.task_id, func.avg(prior.steps_done).label("mean"))
                .where(prior.task_id.in_(select(mine.task_id).where(mine.batch_id == batch_id,
                                                                   mine.status.in_(UNFINISHED_SAMPLES))),
                       prior.batch_id != batch_id, prior.status == SampleStatus.COMPLETED)
                .group_by(prior.task_id).subquery())
        fallback = Sample.steps_done + 1 if fallback_mean is None else literal(fallback_mean, Float)
        gap = func.coalesce(hist.c.mean, fallback) - Sample.steps_done
        left = case((gap < 1, 1.0), else_=gap)
        q = (select(func.count(), func.count(hist.c.mean), func.sum(left), func.max(left))
             .select_from(Sample).outerjoin(hist, hist.c.task_id == Sample.task_id).where(unfinished))
        with self.session() as s:
            n, with_history, steps, longest = s.execute(q).one()
        return RemainingSteps(n, with_history, float(steps or 0.0), float(longest or 0.0))

    def chain_step_s(self, batch_id: int) -> float | None:
        """Mean seconds per step along one chain: over the samples with completed steps, (their last
        completed step's end - admission) / steps done, at least 0."""
        last = (select(Step.sample_id, func.max(Step.finished_at).label("last_fin"))
                .where(Step.batch_id == batch_id, Step.status == StepStatus.COMPLETED)
                .group_by(Step.sample_id).subquery())
        per_step = (last.c.last_fin - Sample.admitted_at) / Sample.steps_done
        q = (select(func.avg(case((per_step < 0, 0.0), else_=per_step)))
             .join(last, last.c.sample_id == Sample.id).where(Sample.steps_done > 0))
        with self.session() as s:
            value = s.scalar(q)
        return None if value is None else float(value)

    def group_tallies(self, batch_id: int) -> dict[str, GroupTally]:
        """Per task group (samples without one left out): samples, scored samples, mean score."""
        score = func.nullif(Sample.score, literal(float("nan")))  # PostgreSQL keeps NaN; SQLite stores NULL
        q = (select(Sample.task_group, func.count(), func.count(score), func.avg(score))
             .where(Sample.batch_id == batch_id, Sample.task_group.is_not(None)).group_by(Sample.task_group))
        with self.session() as s:
            return {str(g): GroupTally(n, scored, None if mean is None else float(mean))
                    for g, n, scored, mean in s.execute(q)}

    def samples_with_error_prefix(self, batch_id: int, prefix: str) -> list[Row[tuple[int, str, str]]]:
        """(id, task_id, error) of the batch's samples whose error starts with `prefix`, by index."""
        q = (select(Sample.id, Sample.task_id, Sample.error)
             .where(Sample.batch_id == batch_id, Sample.error.startswith(prefix, autoescape=True))
             .order_by(Sample.index))
        with self.session() as s:
            return list(s.execute(q))

    # --- steps ---------------------------------------------------------------------------------
    def completed_steps(self, sample_id: int) -> list[Step]:
        q = (
            select(Step)
            .where(Step.sample_id == sample_id, Step.status == StepStatus.COMPLETED)
            .order_by(Step.index)
        )
        with self.session() as s:
            return list(s.scalars(q))

    def step_history(self, sample_id: int) -> StepHistory:
        """A sample's completed steps (by index) and how many attempts each step index has recorded, in
        one read: what a resumed sample needs to rebuild and to number its next attempt."""
        q = select(Step).where(Step.sample_id == sample_id).order_by(Step.index, Step.attempt)
        history = StepHistory()
        with self.session() as s:
            for step in s.scalars(q):
                history.attempts[step.index] = max(history.attempts.get(step.index, 0), step.attempt)
                history.latest[step.index] = step  # in attempt order: the last one wins
                if step.status == StepStatus.COMPLETED:
                    history.completed.append(step)
        return history

    def steps(self, batch_id: int) -> list[Step]:
        with self.session() as s:
            return list(s.scalars(select(Step).where(Step.batch_id == batch_id).order_by(Step.id)))

    def abandon_running(self, batch_id: int, fences: Mapping[int, int] | None = None) -> int:
        """Mark steps left `running` by a dead process as abandoned; returns how many. `fences`
        (sample id -> lease token): only steps of those samples, and only of the ones whose row still
        carries that token, checked in the same transaction (a process that lost a sample's lease
        leaves its steps alone); None: every sample of the batch."""
        where = [Step.batch_id == batch_id, Step.status == StepStatus.RUNNING]
        with self.session() as s, s.begin():
            if fences is not None:
                where.append(Step.sample_id.in_(sorted(still_held(s.connection(), fences))))
            result = _dml(s,
                update(Step)
                .where(*where)
                .values(status=StepStatus.ABANDONED, error="process died while the step ran")
            )
            return result.rowcount or 0

    # --- workers -------------------------------------------------------------------------------
    def upsert_worker(
        self,
        batch_id: int,
        name: str,
        kind: str,
        endpoint: str | None = None,
        settings: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        for attempt in range(2):
            try:
                with self.session() as s, s.begin():
                    worker = s.scalar(select(Worker).where(Worker.batch_id == batch_id, Worker.name == name))
                    if worker is None:
                        worker = Worker(batch_id=batch_id, name=name, kind=kind)
                        s.add(worker)
                    worker.endpoint = redact_text(endpoint) if endpoint is not None else worker.endpoint
                    worker.settings = redact_value(settings) if settings is not None else worker.settings
                    worker.metrics = redact_value(metrics) if metrics is not None else worker.metrics
                return
            except IntegrityError:
                # Another process (a second `join` of the batch) inserted the row between our read and
                # our insert: it exists now, so the second attempt updates it.
                if attempt:
                    raise


def _extreme(pick: Callable[[list[float]], float], *values: float | None) -> float | None:
    """`pick` (min or max) of the values given (None when none is)."""
    present = [float(x) for x in values if x is not None]
    return pick(present) if present else None
