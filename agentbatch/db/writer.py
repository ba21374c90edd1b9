"""The batched step writer: step rows and sample updates committed in groups, off the event loop.

One thread owns the writes of a process. Coroutines hand it rows (`write_step`, `update_sample`)
and await a future that resolves once *their* row is committed; the thread takes everything that
queued up while it committed the last group and commits it in one transaction. So a step counts as
completed only once its row is in the database (resume stays exact), and a thousand steps per second
cost a few dozen transactions, none of them on the event loop.

Writes of one sample keep their order: the queue is FIFO and a group applies its sample updates in
arrival order (later values win). A group that fails is retried item by item, so one bad row fails
only its own writer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, update

from agentbatch.db.models import Sample, Step
from agentbatch.db.store import Store

log = logging.getLogger(__name__)

_STEPS = Step.__table__
_SAMPLES = Sample.__table__
# Columns kept when set: a resumed sample keeps its first admission time and its last worker.
_KEEP_FIRST = frozenset({"admitted_at"})
_KEEP_IF_NULL = frozenset({"last_worker"})


@dataclass(slots=True)
class _Item:
    step: dict[str, Any] | None  # a Step row to insert
    sample_id: int | None  # the sample to update
    values: dict[str, Any]  # its new column values
    future: asyncio.Future[None] | None
    loop: asyncio.AbstractEventLoop | None


@dataclass
class WriterStats:
    groups: int = 0
    rows: int = 0
    largest_group: int = 0
    retried_groups: int = 0
    write_s: float = 0.0  # time inside transactions (the writer thread's, not the event loop's)


@dataclass
class _Group:
    items: list[_Item] = field(default_factory=list)

    def steps(self) -> list[dict[str, Any]]:
        return [i.step for i in self.items if i.step is not None]

    def sample_values(self) -> dict[int, dict[str, Any]]:
        merged: dict[int, dict[str, Any]] = {}
        for item in self.items:
            if item.sample_id is not None:
                values = merged.setdefault(item.sample_id, {})
                values.update((k, v) for k, v in item.values.items() if k not in _KEEP_FIRST or k not in values)
        return merged


def _update_statements(merged: dict[int, dict[str, Any]]) -> Iterable[tuple[Any, list[dict[str, Any]]]]:
    """One executemany UPDATE per distinct set of columns."""
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for sample_id, values in merged.items():
        by_columns.setdefault(tuple(sorted(values)), []).append({"_sid": sample_id, **{f"_{k}": v for k, v in
                                                                                         values.items()}})
    for columns, rows in by_columns.items():
        assignments: dict[str, Any] = {}
        for c in columns:
            param = bindparam(f"_{c}")
            if c in _KEEP_FIRST:
                assignments[c] = func.coalesce(_SAMPLES.c[c], param)
            elif c in _KEEP_IF_NULL:
                assignments[c] = func.coalesce(param, _SAMPLES.c[c])
            else:
                assignments[c] = param
        yield update(_SAMPLES).where(_SAMPLES.c.id == bindparam("_sid")).values(**assignments), rows


def write_group(conn: Connection, group: _Group) -> None:
    """Insert the group's step rows and apply its sample updates (inside the caller's transaction)."""
    # executemany needs one set of columns: inference and environment rows differ, so one INSERT per set
    by_columns: dict[frozenset[str], list[dict[str, Any]]] = {}
    for row in group.steps():
        by_columns.setdefault(frozenset(row), []).append(row)
    for rows in by_columns.values():
        conn.execute(insert(_STEPS), rows)
    for statement, rows in _update_statements(group.sample_values()):
        conn.execute(statement, rows)


class StepWriter:
    """Group-committing writer of step rows and sample updates; one per process and store."""

    def __init__(self, store: Store, *, max_group: int = 1000) -> None:
        self.store = store
        self.max_group = max_group
        self.stats = WriterStats()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> StepWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agentbatch-step-writer", daemon=True)
            self._thread.start()
        return self

    async def aclose(self) -> None:
        """Commit what is queued, then stop the thread (without blocking the event loop)."""
        if self._thread is None or self._closed:
            self._closed = True
            return
        self._closed = True
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)

    async def __aenter__(self) -> StepWriter:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- writes (awaited: they return once committed) -----------------------------------------------
    async def write_step(self, step: dict[str, Any], advance: dict[str, Any] | None = None) -> None:
        """Insert one Step row (column -> value) and, in the same transaction, update its sample
        with `advance` (e.g. steps_done, last_worker)."""
        await self._submit(_Item(step, step["sample_id"] if advance else None, advance or {}, None, None))

    async def update_sample(self, sample_id: int, values: dict[str, Any]) -> None:
        await self._submit(_Item(None, sample_id, values, None, None))

    def post_step(self, step: dict[str, Any]) -> None:
        """Queue a row without waiting for it (a cancelled step's failed attempt, for the history)."""
        if self._closed or self._thread is None:
            return
        self._queue.put(_Item(step, None, {}, None, None))

    def _submit(self, item: _Item) -> asyncio.Future[None]:
        if self._closed or self._thread is None:
            raise RuntimeError("the step writer is not running")
        loop = asyncio.get_running_loop()
        item.future, item.loop = loop.create_future(), loop
        self._queue.put(item)
        return item.future

    # --- the writer thread --------------------------------------------------------------------------
    def _take(self) -> tuple[_Group, bool]:
        first = self._queue.get()
        group, stop = _Group(), first is None
        if first is not None:
            group.items.append(first)
        while len(group.items) < self.max_group:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stop = True
            else:
                group.items.append(item)
        return group, stop

    def _run(self) -> None:
        while True:
            group, stop = self._take()
            if group.items:
                self._commit(group)
            if stop and self._queue.empty():
                return

    def _commit(self, group: _Group) -> None:
        started = time.perf_counter()
        try:
            with self.store.engine.begin() as conn:
                write_group(conn, group)
            _resolve(group.items, None)
        except Exception as exc:  # noqa: BLE001 - retried one by one below, each failing only itself
            log.debug("step writer: a group of %d failed (%s); retrying its items one by one", len(group.items), exc)
            self.stats.retried_groups += 1
            for item in group.items:
                try:
                    with self.store.engine.begin() as conn:
                        write_group(conn, _Group([item]))
                    _resolve([item], None)
                except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                    log.warning("step writer: a write failed: %s", exc)
                    _resolve([item], exc)
        self.stats.groups += 1
        self.stats.rows += len(group.items)
        self.stats.largest_group = max(self.stats.largest_group, len(group.items))
        self.stats.write_s += time.perf_counter() - started


def _resolve(items: list[_Item], exc: BaseException | None) -> None:
    """Wake the awaiting coroutines: one thread-safe call per event loop, not one per item."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for item in items:
        if item.loop is not None and item.future is not None:
            by_loop.setdefault(item.loop, []).append(item.future)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, futures, exc)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _set_all(futures: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for f in futures:
        if f.done():
            continue
        if exc is None:
            f.set_result(None)
        else:
            f.set_exception(exc)
