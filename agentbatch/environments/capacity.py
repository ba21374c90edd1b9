"""A capacity limiter for environment resources (live containers, concurrent executions, tool calls).

Unlike `asyncio.Semaphore` it is not bound to one event loop: the task runner, a test and a
thread-per-loop executor may all share one pool. Waiters are served first come, first served, and
the limiter keeps the numbers the tests and reports read back (peak, a timeline of changes).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    granted: bool = False


@dataclass(slots=True)
class LimiterStats:
    limit: int | None
    in_use: int
    waiting: int
    peak: int
    acquired: int
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, in use after)


class CapacityLimiter:
    """At most `limit` holders at once (`None`: unlimited, still counted)."""

    def __init__(self, limit: int | None, name: str = "", keep_timeline: bool = True) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"{name or 'limiter'}: limit must be >= 1 or None, got {limit}")
        self.limit = limit
        self.name = name
        self._lock = threading.Lock()
        self._in_use = 0
        self._peak = 0
        self._acquired = 0
        self._waiters: deque[_Waiter] = deque()
        self._timeline: list[tuple[float, int]] | None = [] if keep_timeline else None

    def _note(self) -> None:  # caller holds the lock
        self._peak = max(self._peak, self._in_use)
        if self._timeline is not None:
            self._timeline.append((time.monotonic(), self._in_use))

    async def acquire(self) -> None:
        with self._lock:
            if not self._waiters and (self.limit is None or self._in_use < self.limit):
                self._in_use += 1
                self._acquired += 1
                self._note()
                return
            waiter = _Waiter(asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if not waiter.granted:
                    self._waiters.remove(waiter)
                    raise
            self.release()  # the slot was handed over just as we were cancelled: pass it on
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.loop.is_closed():
                    continue
                # Hand the slot straight to the next waiter: in_use stays the same.
                waiter.granted = True
                self._acquired += 1
                self._note()
                waiter.loop.call_soon_threadsafe(_wake, waiter.future)
                return
            if self._in_use <= 0:
                raise RuntimeError(f"{self.name or 'limiter'}: release without acquire")
            self._in_use -= 1
            self._note()

    @asynccontextmanager
    async def slot(self):
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    @property
    def in_use(self) -> int:
        return self._in_use

    def stats(self) -> LimiterStats:
        with self._lock:
            return LimiterStats(
                limit=self.limit,
                in_use=self._in_use,
                waiting=len(self._waiters),
                peak=self._peak,
                acquired=self._acquired,
                timeline=list(self._timeline or []),
            )


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
