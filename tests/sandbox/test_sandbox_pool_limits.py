"""50 samples through a pool of 8 container slots and 4 exec slots: neither limit is ever exceeded,
as seen from outside (the engine's own list of live containers, sampled by a thread) and from the
recorded start/end of every exec; both limits are reached; nothing is left behind."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from testkit import max_overlap

from agentbatch.environments.docker_pool import DockerPool, list_labelled

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SAMPLES, CONTAINERS, EXECS = 50, 8, 4


def test_pool_never_exceeds_its_limits(docker_client, batch_label: str) -> None:
    seen: list[int] = []
    stop = threading.Event()

    def sampler() -> None:  # the engine's view, independent of the pool's counters
        while not stop.is_set():
            seen.append(len(list_labelled(docker_client, batch_label)))  # created or running
            time.sleep(0.05)

    execs: list[tuple[float, float]] = []

    async def sample(pool: DockerPool, i: int) -> str:
        sb = await pool.start(f"s{i}")
        try:
            out = []
            for cmd in (f"echo {i} > mine", "sleep 0.2; cat mine"):
                res = await pool.exec(sb, cmd)
                out.append(res.stdout.strip())
            return out[-1]
        finally:
            await pool.remove(sb)

    async def main():
        pool = DockerPool(batch_label=batch_label, max_containers=CONTAINERS, max_exec=EXECS)
        original = pool._exec_blocking

        def timed(*args):  # the blocking SDK call itself, as it runs on the pool's threads
            start = time.monotonic()
            try:
                return original(*args)
            finally:
                execs.append((start, time.monotonic()))

        pool._exec_blocking = timed
        try:
            results = await asyncio.gather(*(sample(pool, i) for i in range(SAMPLES)))
            return results, pool.stats()
        finally:
            await pool.aclose()

    thread = threading.Thread(target=sampler)
    thread.start()
    try:
        results, stats = asyncio.run(main())
    finally:
        stop.set()
        thread.join()
    assert results == [str(i) for i in range(SAMPLES)]  # each sample saw its own container
    assert len(execs) == 2 * SAMPLES
    assert max_overlap(execs) <= EXECS
    assert max(seen) <= CONTAINERS
    assert stats["containers"]["peak"] == CONTAINERS and stats["exec"]["peak"] == EXECS
    assert stats["containers"]["created"] == SAMPLES and stats["containers"]["live"] == 0
    assert list_labelled(docker_client, batch_label) == []
