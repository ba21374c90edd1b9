"""The batched step writer on SQLite and PostgreSQL: group commits off the event loop, a write counts
only once committed, one bad row fails only itself, a sample's updates keep their order."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import pytest

from agentbatch.db.models import SampleStatus, StepStatus
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter


def new_batch(store: Store, n: int) -> tuple[int, list[int]]:
    bid = store.create_batch("w", {}, [(f"t{i}", {}) for i in range(n)])
    return bid, [s.id for s in store.samples(bid)]


def step_row(bid: int, sid: int, index: int, response: Any = None) -> dict[str, Any]:
    now = time.time()
    return {"batch_id": bid, "sample_id": sid, "index": index, "kind": "inference" if index % 2 == 0 else
            "environment", "status": StepStatus.COMPLETED, "attempt": 1, "enqueued_at": now, "started_at": now,
            "finished_at": now, "worker": "w0", "response": response if response is not None else {"i": index}}


def test_concurrent_steps_commit_in_groups(store: Store) -> None:
    bid, sids = new_batch(store, 50)

    async def sample(writer: StepWriter, sid: int) -> None:
        for index in range(6):  # a chain: each step waits for its own commit before the next
            row = step_row(bid, sid, index)  # the two kinds carry different columns, as in a batch
            row.update({"prompt_tokens": 10, "output_tokens": 2} if index % 2 == 0 else {"tool_calls": 1})
            await writer.write_step(row, {"steps_done": index + 1,
                                                                 "last_worker": "w0" if index % 2 == 0 else None})

    async def main() -> StepWriter:
        async with StepWriter(store) as writer:
            await asyncio.gather(*(sample(writer, sid) for sid in sids))
        return writer

    writer = asyncio.run(main())
    steps = store.steps(bid)
    assert len(steps) == 300 and {(s.sample_id, s.index) for s in steps} == {(i, j) for i in sids for j in range(6)}
    assert all(s.steps_done == 6 and s.last_worker == "w0" for s in store.samples(bid))
    assert writer.stats.rows == 300
    assert writer.stats.groups < 300 and writer.stats.largest_group > 1  # many steps per transaction
    assert writer.stats.retried_groups == 0  # mixed rows commit as one group, not one by one
    assert {s.prompt_tokens for s in steps if s.index % 2 == 0} == {10}


def test_bad_row_fails_only_its_writer(store: Store) -> None:
    bid, sids = new_batch(store, 3)

    async def main() -> list[BaseException | None]:
        async with StepWriter(store) as writer:
            results = await asyncio.gather(
                writer.write_step(step_row(bid, sids[0], 0), {"steps_done": 1}),
                writer.write_step(step_row(bid, sids[1], 0, response={"x": object()}), {"steps_done": 1}),
                writer.write_step(step_row(bid, sids[2], 0), {"steps_done": 1}),
                return_exceptions=True,
            )
        return list(results)

    ok0, bad, ok2 = asyncio.run(main())
    assert ok0 is None and ok2 is None and isinstance(bad, Exception)
    assert sorted(s.sample_id for s in store.steps(bid)) == [sids[0], sids[2]]
    assert [s.steps_done for s in store.samples(bid)] == [1, 0, 1]  # the failed step did not advance its sample


def test_sample_updates_keep_order_and_first_admission(store: Store) -> None:
    bid, sids = new_batch(store, 1)

    async def main() -> None:
        async with StepWriter(store) as writer:
            # queued back to back, so they likely share a group: later values win, admitted_at stays first
            await asyncio.gather(
                writer.update_sample(sids[0], {"status": SampleStatus.RUNNING, "admitted_at": 10.0}),
                writer.update_sample(sids[0], {"status": SampleStatus.RUNNING, "admitted_at": 20.0}),
                writer.update_sample(sids[0], {"status": SampleStatus.COMPLETED, "score": 1.0, "finished_at": 30.0}),
            )

    asyncio.run(main())
    [s] = store.samples(bid)
    assert (s.status, s.score, s.admitted_at, s.finished_at) == ("completed", 1.0, 10.0, 30.0)


def test_writes_wait_off_the_event_loop_until_committed(tmp_path) -> None:
    """While another connection holds SQLite's write lock the write cannot commit: the awaiting
    coroutine is not resumed, and the event loop keeps running everything else."""
    path = tmp_path / "locked.sqlite"
    store = Store(f"sqlite:///{path}")
    bid, sids = new_batch(store, 1)
    blocker = sqlite3.connect(path, isolation_level=None, timeout=30)

    async def main() -> tuple[bool, int, int]:
        async with StepWriter(store) as writer:
            blocker.execute("BEGIN IMMEDIATE")  # hold the write lock
            write = asyncio.ensure_future(writer.write_step(step_row(bid, sids[0], 0), {"steps_done": 1}))
            ticks = 0
            for _ in range(20):  # the loop runs while the writer thread waits for the lock
                await asyncio.sleep(0.01)
                ticks += 1
            done_while_locked = write.done()
            visible_while_locked = blocker.execute("select count(*) from steps").fetchone()[0]
            blocker.execute("COMMIT")
            await write
        return done_while_locked, ticks, visible_while_locked

    done_while_locked, ticks, visible = asyncio.run(main())
    blocker.close()
    assert not done_while_locked and ticks == 20 and visible == 0
    assert [s.status for s in store.steps(bid)] == ["completed"]
    store.close()


def test_closed_writer_refuses(store: Store) -> None:
    async def main() -> None:
        writer = StepWriter(store).start()
        await writer.aclose()
        with pytest.raises(RuntimeError, match="not running"):
            await writer.update_sample(1, {"status": "running"})

    asyncio.run(main())
