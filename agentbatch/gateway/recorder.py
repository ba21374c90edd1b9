"""The gateways' store writer: one background thread, writes in submission order.

Requests are not held up by the store: a step's `running` row and its completion are queued here
with the times the gateway measured, so the only cost on the request path is handing over a job.
Closing drains the queue, so every record is committed before the batch is marked finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from agentbatch.db import gateway_records as records
from agentbatch.db.store import StepOutcome, Store

log = logging.getLogger("agentbatch.gateway")
T = TypeVar("T")


class StepRecorder:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentbatch-gateway-store")
        self.errors = 0

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future = self._pool.submit(fn, self.store, *args, **kwargs)
        future.add_done_callback(self._log_error)
        return future

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a write (or read) in order with the others and wait for its result."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def begin(self, start: records.StepStart) -> concurrent.futures.Future[int]:
        return self.submit(records.begin_step, start)

    def complete(self, step: concurrent.futures.Future[int], outcome: StepOutcome, finished_at: float) -> None:
        # FIFO on one thread: the begin job has run by the time this one starts.
        self.submit(lambda store: records.complete_step(store, step.result(), outcome, finished_at))

    def fail(self, step: concurrent.futures.Future[int], error: str, finished_at: float) -> None:
        self.submit(lambda store: records.fail_step(store, step.result(), error, finished_at))

    def _log_error(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.errors += 1
            log.error("gateway store write failed: %r", future.exception())

    def close(self) -> None:
        """Commit everything queued, then stop the thread."""
        self._pool.shutdown(wait=True)
