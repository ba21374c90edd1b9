"""The gateways' store writer: one background thread, group commits, writes in submission order.

Requests are not held up by the store: a step's `running` row, its completion and the samples'
admissions and ends are queued here with the times the gateway measured. The thread takes every
queued write (after waiting `group_delay_s` for more to arrive) and commits them in one transaction,
so the store costs a fraction of a millisecond per record and the event loop rarely waits for the
interpreter lock. Closing drains the queue: every record is committed before the batch is finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentbatch.db import gateway_records as records
from agentbatch.db.store import StepOutcome, Store

log = logging.getLogger("agentbatch.gateway")
T = TypeVar("T")


@dataclass(slots=True)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: concurrent.futures.Future[Any]


class StepRecorder:
    def __init__(self, store: Store, *, group_delay_s: float = 0.1) -> None:
        self.store = store
        self.group_delay_s = group_delay_s
        self.errors = 0
        self.commits = 0
        self.records = 0
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="agentbatch-gateway-store", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Queue `fn(session, *args, **kwargs)`; its future resolves once the write is committed."""
        if self._closed:
            raise RuntimeError("the recorder is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put(_Job(fn, args, kwargs, future))
        return future

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Queue a write (or read) and wait until it is committed; returns its result."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def begin(self, start: records.StepStart) -> None:
        self.submit(records.begin_step, start)

    def complete(self, key: records.StepKey, kind: str, outcome: StepOutcome, finished_at: float) -> None:
        self.submit(records.complete_step, key, kind, outcome, finished_at)

    def fail(self, key: records.StepKey, error: str, finished_at: float) -> None:
        self.submit(records.fail_step, key, error, finished_at)

    # --- the writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            time.sleep(self.group_delay_s)  # let more records join this transaction
            jobs = [first]
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
            self._write(jobs)

    def _write(self, jobs: list[_Job]) -> None:
        try:
            with self.store.session() as session, session.begin():
                results = [job.fn(session, *job.args, **job.kwargs) for job in jobs]
        except Exception:  # noqa: BLE001 - find the job at fault: one transaction each
            for job in jobs:
                self._write_one(job)
            return
        self.commits += 1
        self.records += len(jobs)
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)

    def _write_one(self, job: _Job) -> None:
        try:
            with self.store.session() as session, session.begin():
                result = job.fn(session, *job.args, **job.kwargs)
        except Exception as exc:  # noqa: BLE001 - reported through the future and the log
            self.errors += 1
            log.error("gateway store write %s failed: %r", getattr(job.fn, "__name__", job.fn), exc)
            job.future.set_exception(exc)
            return
        self.commits += 1
        self.records += 1
        job.future.set_result(result)

    def close(self) -> None:
        """Commit everything queued, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()

