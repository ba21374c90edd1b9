"""The one writer of step attempts and sample updates: group commits, off the event loop.

Every driver (the runner, also under `agentbatch join`, and both gateways) hands its writes here
(`db/step_records.py`); one thread per process commits them. A write is either awaited (`commit`:
returns once *its* transaction committed; the runner's completions, so a step counts as completed only
once its row is in the database and resume stays exact) or posted (`record`: committed within
`group_delay_s`, never waited for; the gateways' rows, failed and cancelled attempts). The thread
takes everything queued and commits it in one transaction: a thousand steps per second cost a few
dozen transactions, none of them on the event loop.

An attempt's `running` row costs nothing on the hot path: its begin is held in the writer thread and
folded into the attempt's final row when the attempt ends within `show_after_s`; only an attempt
still running then gets a `running` row (updated when it ends). So `status` shows the steps really in
flight (those running longer than `show_after_s`), and a process that dies leaves them `running`, to be
marked abandoned on resume. A begin with sample values (an external environment's `in_flight_step`)
is committed before the step runs.

Fencing: a writer given the lease tokens its process holds (`fences`: sample id -> token, from
`db/leases.py`) commits a write for a fenced sample only if the sample's row carries that token, read
under lock in the group's own transaction (PostgreSQL: `FOR UPDATE`; SQLite: after taking the write
lock). A write for a sample whose lease was taken over is not applied; it fails with `LeaseLost` for
its own writer only, the rest of the group commits.

Hand-off: a write is appended to a deque and the thread is woken only when it would otherwise sleep
past the write's deadline (an awaited write, or the first posted write after an idle spell): under load
one wake-up takes a whole group, and the event loop never waits on a lock or a thread switch per write.

Writes of one sample keep their order: the deque is FIFO and a group applies its sample updates in
arrival order (later values win). A group that fails is retried write by write, so one bad row fails
only its own writer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import BindParameter, Connection, Float, Integer, String, bindparam, func, insert, update
from sqlalchemy.orm import Session

from agentbatch.db.fencing import locked_tokens
from agentbatch.db.leases import LeaseLost
from agentbatch.db.models import SAMPLES, STEPS
from agentbatch.db.step_records import SampleKey, StepWrite, sample_id_of, sample_update
from agentbatch.db.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")

_KEY = ("sample_id", "index", "attempt")
# Columns kept when set: a resumed sample keeps its first admission time and its last worker.
_KEEP_FIRST = frozenset({"admitted_at"})
_KEEP_IF_NULL = frozenset({"last_worker"})
Job = Callable[[Session], Any]


@dataclass(slots=True)
class _Item:
    write: StepWrite | None  # or a job
    job: Job | None = None
    future: asyncio.Future[Any] | concurrent.futures.Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    urgent: bool = False  # awaited: commit without waiting for company
    at: float = 0.0  # monotonic time it was queued


@dataclass(slots=True)
class _Op:
    """What one write becomes in the database: a step row inserted or updated, sample values, or a job."""

    insert: dict[str, Any] | None = None
    update: dict[str, Any] | None = None
    sample: SampleKey | None = None
    sample_values: dict[str, Any] | None = None
    job: Job | None = None
    items: list[_Item] = field(default_factory=list)  # whose futures it resolves
    opens: tuple[Any, ...] | None = None  # the attempt whose `running` row it writes

    def sample_id(self) -> int | None:
        """The sample row the op writes for (None: a job, or a row not written yet)."""
        key = self.sample if self.sample is not None else (self.insert or self.update or {}).get("sample_id")
        return key if isinstance(key, int) else None


@dataclass
class WriterStats:
    groups: int = 0
    rows: int = 0  # writes committed
    largest_group: int = 0
    retried_groups: int = 0
    folded: int = 0  # attempts written once (begin folded into the final row)
    running_rows: int = 0  # attempts that got a `running` row first
    write_s: float = 0.0  # time inside transactions (the writer thread's, not the event loop's)


def _resolved(row: dict[str, Any]) -> dict[str, Any]:
    sid = row["sample_id"]
    return row if isinstance(sid, int) else {**row, "sample_id": sample_id_of(sid)}


def _psycopg(conn: Connection) -> Any | None:
    """The transaction's own psycopg connection on PostgreSQL through psycopg (COPY, array parameters);
    None on any other store or driver."""
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        return None
    return conn.connection.driver_connection


def _insert_steps(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Step rows of one set of columns. On PostgreSQL through psycopg one COPY: an executemany INSERT
    cost the writer thread most of its ~70 us per row in psycopg's per-row pipeline work, a COPY row a
    fraction of it. The values go through the same bind processors (JSON columns) as the INSERT's."""
    driver = _psycopg(conn)
    if driver is None:
        conn.execute(insert(STEPS), rows)
        return
    dialect = conn.dialect
    columns = [(c, STEPS.c[c].type.dialect_impl(dialect).bind_processor(dialect)) for c in rows[0]]
    names = ", ".join(dialect.identifier_preparer.quote(c) for c, _ in columns)
    cursor = driver.cursor()
    with cursor, cursor.copy(f"COPY {STEPS.name} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row[c] if p is None else p(row[c]) for c, p in columns])


def _update_samples(conn: Connection, merged: dict[int, dict[str, Any]]) -> None:
    """The merged sample values, one UPDATE per distinct set of columns: on PostgreSQL through psycopg
    (columns of plain types) one statement over arrays, where an executemany cost psycopg's per-row
    pipeline work for every sample of the group (46 -> 38 us of writer CPU per gateway tool call row)."""
    by_columns: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    for sample_id, values in merged.items():
        by_columns.setdefault(tuple(sorted(values)), []).append((sample_id, values))
    driver = _psycopg(conn)
    for columns, rows in by_columns.items():
        if driver is not None and all(isinstance(SAMPLES.c[c].type, _PLAIN) for c in columns):
            driver.execute(_array_update(conn.dialect, columns), [
                [sid for sid, _ in rows], *([values[c] for _, values in rows] for c in columns)])
        else:
            conn.execute(_update_statement(columns), [
                {"_sid": sid, **{f"_{k}": v for k, v in values.items()}} for sid, values in rows])


_PLAIN = (Integer, Float, String)  # column types whose values go in arrays as they are (no bind processor)


def _array_update(dialect: Any, columns: tuple[str, ...]) -> str:
    """`UPDATE samples ... FROM unnest(ids, column arrays...)` for `columns` (the same rules as
    `_update_statement`)."""
    quote = dialect.identifier_preparer.quote
    assignments = []
    for i, c in enumerate(columns):
        own, new = f"{SAMPLES.name}.{quote(c)}", f"v.c{i}"
        value = (f"coalesce({own}, {new})" if c in _KEEP_FIRST else f"coalesce({new}, {own})" if c in _KEEP_IF_NULL
                 else new)
        assignments.append(f"{quote(c)} = {value}")
    arrays = ", ".join(f"%s::{SAMPLES.c[c].type.compile(dialect)}[]" for c in columns)
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    return (f"UPDATE {SAMPLES.name} SET {', '.join(assignments)} FROM unnest(%s::integer[], {arrays}) "
            f"AS v(sid, {names}) WHERE {SAMPLES.name}.id = v.sid")


def _update_statement(columns: tuple[str, ...]) -> Any:
    """An UPDATE of one sample's `columns` for executemany: an admission time is kept once set, a
    worker kept when none is given."""
    assignments: dict[str, Any] = {}
    for c in columns:
        param: BindParameter[Any] = bindparam(f"_{c}")
        if c in _KEEP_FIRST:
            assignments[c] = func.coalesce(SAMPLES.c[c], param)
        elif c in _KEEP_IF_NULL:
            assignments[c] = func.coalesce(param, SAMPLES.c[c])
        else:
            assignments[c] = param
    return update(SAMPLES).where(SAMPLES.c.id == bindparam("_sid")).values(**assignments)


def _apply_rows(conn: Connection, ops: list[_Op]) -> None:
    """Step inserts, step updates, then the merged sample updates of `ops` (no jobs among them)."""
    # executemany needs one set of columns: inference and environment rows differ, so one per set
    inserts: dict[frozenset[str], list[dict[str, Any]]] = {}
    updates: dict[frozenset[str], list[dict[str, Any]]] = {}
    merged: dict[int, dict[str, Any]] = {}
    for op in ops:
        if op.insert is not None:
            row = _resolved(op.insert)
            inserts.setdefault(frozenset(row), []).append(row)
        if op.update is not None:
            row = _resolved(op.update)
            updates.setdefault(frozenset(row), []).append({f"_{k}": v for k, v in row.items()})
        if op.sample is not None and op.sample_values:
            values = merged.setdefault(sample_id_of(op.sample), {})
            values.update((k, v) for k, v in op.sample_values.items() if k not in _KEEP_FIRST or k not in values)
    for rows in inserts.values():
        _insert_steps(conn, rows)
    for columns, params in updates.items():
        where = (STEPS.c.sample_id == bindparam("_sample_id")) & (STEPS.c.index == bindparam("_index")) & (
            STEPS.c.attempt == bindparam("_attempt"))
        values = {c: bindparam(f"_{c}") for c in columns if c not in _KEY}
        conn.execute(update(STEPS).where(where).values(**values), params)
    _update_samples(conn, merged)


def fenced(conn: Connection, ops: list[_Op], fences: Mapping[int, int]) -> tuple[list[_Op], list[_Op]]:
    """The ops whose sample this process still leases (its row carries the token claimed with), and
    those it lost; the rows stay locked until the caller's transaction ends, so no claim slips between."""
    ids = sorted({sid for op in ops if (sid := op.sample_id()) is not None and sid in fences})
    if not ids:
        return ops, []
    current = locked_tokens(conn, ids)
    lost = {sid for sid in ids if current.get(sid) != fences[sid]}
    if not lost:
        return ops, []
    return ([op for op in ops if op.sample_id() not in lost], [op for op in ops if op.sample_id() in lost])


def apply_ops(session: Session, ops: list[_Op]) -> list[Any]:
    """Apply the ops in order inside the caller's transaction; returns each job's result (None for rows)."""
    results: list[Any] = [None] * len(ops)
    run: list[_Op] = []
    for i, op in enumerate(ops):
        if op.job is None:
            run.append(op)
            continue
        if run:
            _apply_rows(session.connection(), run)
            run = []
        results[i] = op.job(session)
    if run:
        _apply_rows(session.connection(), run)
    return results


class StepWriter:
    """Group-committing writer of step attempts, sample updates and store jobs; one per process and store."""

    def __init__(self, store: Store, *, max_group: int = 1000, group_delay_s: float = 0.1,
                 show_after_s: float = 0.25) -> None:
        self.store = store
        self.max_group = max_group
        self.group_delay_s = group_delay_s  # a posted write waits at most this long for company
        self.show_after_s = show_after_s  # an attempt running longer gets a `running` row
        self.stats = WriterStats()
        self.errors = 0  # writes that failed (each logged)
        self.fences: Mapping[int, int] = {}  # sample id -> lease token this process holds (db/leases.py)
        self.lost = 0  # writes not applied: their sample's lease was taken over
        self._items: deque[_Item] = deque()  # appended by any thread, taken by the writer thread
        self._wake = threading.Event()
        self._wakes_at = math.inf  # when the sleeping writer thread wakes by itself (monotonic)
        self._stopping = False  # close(): take what is queued, commit it, stop
        self._thread: threading.Thread | None = None
        self._closed = False
        # the writer thread's own state
        # begun, no row yet: (row, due), in the order they are due
        self._held: OrderedDict[tuple[Any, ...], tuple[dict[str, Any], float]] = OrderedDict()
        self._open: set[tuple[Any, ...]] = set()  # attempts whose `running` row is committed

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> StepWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agentbatch-step-writer", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Commit everything queued, then stop the thread (blocking: from a thread, or after the loop)."""
        if self._thread is None or self._closed:
            self._closed = True
            return
        self._closed = True
        self._stopping = True
        self._wake.set()
        self._thread.join()

    async def aclose(self) -> None:
        """`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> StepWriter:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- writes -------------------------------------------------------------------------------------
    def record(self, write: StepWrite) -> None:
        """Queue a write without waiting for it (committed within `group_delay_s`; a begin is held)."""
        self._put(_Item(write))

    async def commit(self, write: StepWrite) -> None:
        """Queue a write and return once it is committed (raises what the database raised)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._put(_Item(write, future=future, loop=loop, urgent=True))
        await future

    async def update_sample(self, sample: SampleKey, values: dict[str, Any]) -> None:
        await self.commit(sample_update(sample, values))

    def submit(self, job: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Queue `job(session, *args, **kwargs)` to run in order with the other writes (the gateways'
        sample rows); its future resolves once committed."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Item(None, job=lambda s: job(s, *args, **kwargs), future=future))
        return future

    def _put(self, item: _Item) -> None:
        if self._closed or self._thread is None:
            if item.future is None:  # posted late (a step cancelled while the batch shuts down)
                log.debug("step writer closed: a posted write is dropped")
                return
            raise RuntimeError("the step writer is not running")
        item.at = now = time.monotonic()
        self._items.append(item)
        # Read after the append: the thread publishes its wake time before it looks at the deque a
        # last time, so either it sees this item or this sees the time it will sleep until.
        if item.urgent or now + self.group_delay_s < self._wakes_at:
            self._wake.set()

    # --- the writer thread --------------------------------------------------------------------------
    def _run(self) -> None:
        pending: list[_Item] = []
        while True:
            self._wake.clear()  # before taking: a write appended after this sets it again
            stop = self._take(pending)
            if stop or self._due(pending):
                self._commit(pending, flush=stop)
                pending = []
            if stop:
                return
            self._sleep(self._wait_s(pending))

    def _take(self, pending: list[_Item]) -> bool:
        """Move what is queued to `pending` (at most a group); True once closed and all of it taken."""
        stopping = self._stopping  # read first: every write queued before close() is in the deque now
        items = self._items
        while items and len(pending) < self.max_group:
            pending.append(items.popleft())
        return stopping and not items

    def _sleep(self, timeout: float | None) -> None:
        """Wait until something is due, or a write that cannot wait that long arrives."""
        self._wakes_at = math.inf if timeout is None else time.monotonic() + timeout
        if not self._items and (timeout is None or timeout > 0):
            self._wake.wait(timeout)
        self._wakes_at = 0.0  # awake: no write needs to wake it

    def _wait_s(self, pending: list[_Item]) -> float | None:
        """How long the thread may sleep before something is due (None: until a write arrives)."""
        now = time.monotonic()
        deadlines = [self._next_due()] if self._held else []
        if pending:
            deadlines.append(0.0 if any(i.urgent for i in pending) else pending[0].at + self.group_delay_s)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _due(self, pending: list[_Item]) -> bool:
        now = time.monotonic()
        if pending and (len(pending) >= self.max_group or pending[0].at + self.group_delay_s <= now
                        or any(i.urgent for i in pending)):
            return True
        return bool(self._held) and self._next_due() <= now

    def _next_due(self) -> float:
        return next(iter(self._held.values()))[1]

    def _plan(self, items: list[_Item], flush: bool) -> list[_Op]:
        """The ops of a group: begins held (or written when they carry sample values), ends folded into
        one INSERT with their held begin or an UPDATE of their `running` row, and the begins now due."""
        ops: list[_Op] = []
        now = time.monotonic()
        for item in items:
            write = item.write
            if write is None:
                ops.append(_Op(job=item.job, items=[item]))
            elif write.step is None:
                ops.append(_Op(sample=write.sample, sample_values=write.sample_values, items=[item]))
            elif not write.ended and not write.sample_values and not item.urgent:
                self._held[write.key] = (write.step, item.at + self.show_after_s)
            elif not write.ended:
                ops.append(_Op(insert=write.step, sample=write.sample, sample_values=write.sample_values,
                               items=[item], opens=write.key))
            else:
                ops.append(self._end_op(write, item))
        while self._held and (flush or self._next_due() <= now):
            key, (row, _) = self._held.popitem(last=False)
            ops.append(_Op(insert=row, opens=key))
        return ops

    def _end_op(self, write: StepWrite, item: _Item) -> _Op:
        key = write.key
        op = _Op(sample=write.sample, sample_values=write.sample_values, items=[item])
        if self._held.pop(key, None) is not None or key not in self._open:
            op.insert = write.step
            self.stats.folded += 1
        else:
            self._open.discard(key)
            op.update = write.step
        return op

    def _commit(self, items: list[_Item], *, flush: bool) -> None:
        started = time.perf_counter()
        ops = self._plan(items, flush)
        if not ops:
            return
        wake = _Wake()
        try:
            with self.store.session() as session, session.begin():
                kept, lost = fenced(session.connection(), ops, self.fences)
                results = apply_ops(session, kept)
            for op, result in zip(kept, results, strict=True):
                self._done(op, result, None, wake)
            self._lose(lost, wake)
        except Exception as exc:  # noqa: BLE001 - retried one by one below, each failing only itself
            log.debug("step writer: a group of %d failed (%s); retrying its writes one by one", len(ops), exc)
            self.stats.retried_groups += 1
            for op in ops:
                self._commit_one(op, wake)
        wake.send()
        self.stats.groups += 1
        self.stats.rows += len(ops)
        self.stats.largest_group = max(self.stats.largest_group, len(ops))
        self.stats.write_s += time.perf_counter() - started

    def _commit_one(self, op: _Op, wake: _Wake) -> None:
        try:
            with self.store.session() as session, session.begin():
                kept, lost = fenced(session.connection(), [op], self.fences)
                results = apply_ops(session, kept)
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits, and logged
            self.errors += 1
            log.warning("step writer: a write failed: %s", exc)
            self._done(op, None, exc, wake)
            return
        if lost:
            self._lose(lost, wake)
        else:
            self._done(op, results[0], None, wake)

    def _lose(self, ops: list[_Op], wake: _Wake) -> None:
        """Writes for samples whose lease was taken over: not applied; LeaseLost to whoever waits."""
        for op in ops:
            sid = op.sample_id()
            assert sid is not None
            self.lost += 1
            log.info("step writer: sample %s is leased to another process now: a write for it was not applied", sid)
            for item in op.items:
                wake.add(item, None, LeaseLost(sid))

    def _done(self, op: _Op, result: Any, exc: BaseException | None, wake: _Wake) -> None:
        if op.opens is not None and exc is None:
            self._open.add(op.opens)
            self.stats.running_rows += 1
        for item in op.items:
            wake.add(item, result, exc)


@dataclass
class _Wake:
    """Whoever waits on a group: jobs' futures are set at once; awaited writes are woken with one
    thread-safe call per event loop, not one per write."""

    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], BaseException | None]]] = field(
        default_factory=dict)

    def add(self, item: _Item, result: Any, exc: BaseException | None) -> None:
        future = item.future
        if isinstance(future, concurrent.futures.Future):
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
        elif future is not None and item.loop is not None:
            self.by_loop.setdefault(item.loop, []).append((future, exc))

    def send(self) -> None:
        for loop, futures in self.by_loop.items():
            try:
                loop.call_soon_threadsafe(_set_all, futures)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


def _set_all(futures: list[tuple[asyncio.Future[Any], BaseException | None]]) -> None:
    for future, exc in futures:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
