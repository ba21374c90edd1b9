"""The capacity limiter: the limit holds, waiters go first come first served, cancelled waiters
give their turn away, and one limiter works across event loops in different threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentbatch.environments.capacity import CapacityLimiter


def test_limit_holds_and_is_reached() -> None:
    limiter = CapacityLimiter(3)
    live = peak = 0

    async def worker() -> None:
        nonlocal live, peak
        async with limiter.slot():
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.01)
            live -= 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(20)))

    asyncio.run(main())
    assert peak == 3
    stats = limiter.stats()
    assert stats.peak == 3 and stats.in_use == 0 and stats.acquired == 20
    assert max(n for _, n in stats.timeline) == 3


def test_waiters_are_served_in_arrival_order() -> None:
    limiter = CapacityLimiter(1)
    order: list[int] = []

    async def main() -> None:
        await limiter.acquire()

        async def waiter(i: int) -> None:
            async with limiter.slot():
                order.append(i)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(0)  # let it queue before the next one
        limiter.release()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == [0, 1, 2, 3, 4]


def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    limiter = CapacityLimiter(1)

    async def main() -> None:
        await limiter.acquire()
        task = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        limiter.release()
        await asyncio.wait_for(limiter.acquire(), 1)  # the slot is free again
        limiter.release()

    asyncio.run(main())
    assert limiter.in_use == 0


def test_shared_across_event_loops_in_threads() -> None:
    limiter = CapacityLimiter(2)
    lock = threading.Lock()
    live = peak = 0

    async def worker() -> None:
        nonlocal live, peak
        async with limiter.slot():
            with lock:
                live += 1
                peak = max(peak, live)
            await asyncio.sleep(0.005)
            with lock:
                live -= 1

    def thread_main() -> None:
        async def many() -> None:
            await asyncio.gather(*(worker() for _ in range(10)))

        asyncio.run(many())

    threads = [threading.Thread(target=thread_main) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert peak == 2 and limiter.in_use == 0 and limiter.stats().acquired == 40


def test_release_without_acquire_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        CapacityLimiter(1).release()
    with pytest.raises(ValueError):
        CapacityLimiter(0)
