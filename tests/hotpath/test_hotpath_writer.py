"""The one step writer (db/writer.py) on SQLite and PostgreSQL: group commits off the event loop, a
completion counts only once committed, an attempt written once when it ends quickly and as a
`running` row (then updated) when it runs long, posted gateway writes with sample rows written in
order, one bad row failing only itself, a sample's updates keeping their order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

import pytest
from testkit import wait_until

from agentbatch.dashboards.eta import estimate_eta
from agentbatch.db import gateway_records
from agentbatch.db.models import SampleStatus, StepStatus
from agentbatch.db.step_records import SampleRef, StepAttempt, StepOutcome
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter


def new_batch(store: Store, n: int) -> tuple[int, list[int]]:
    bid = store.create_batch("w", {}, [(f"t{i}", {}) for i in range(n)])
    return bid, [s.id for s in store.samples(bid)]


def attempt(bid: int, sid: Any, index: int, number: int = 1) -> StepAttempt:
    now = time.time()
    return StepAttempt(batch_id=bid, sample=sid, index=index, attempt=number,
                       kind="inference" if index % 2 == 0 else "environment", enqueued_at=now, started_at=now,
                       worker="w0", request={"i": index})


def outcome(index: int, response: Any = None) -> StepOutcome:
    tokens = {"prompt_tokens": 10, "output_tokens": 2} if index % 2 == 0 else {"tool_calls": 1}
    return StepOutcome(response=response if response is not None else {"i": index}, worker="w0", **tokens)


def test_concurrent_steps_commit_in_groups(store: Store) -> None:
    bid, sids = new_batch(store, 50)

    async def sample(writer: StepWriter, sid: int) -> None:
        for index in range(6):  # a chain: each step waits for its own commit before the next
            step = attempt(bid, sid, index)
            writer.record(step.begun())  # posted: costs the hot path a queue put
            await writer.commit(step.completed(outcome(index), steps_done=index + 1))

    async def main() -> StepWriter:
        async with StepWriter(store) as writer:
            await asyncio.gather(*(sample(writer, sid) for sid in sids))
        return writer

    writer = asyncio.run(main())
    steps = store.steps(bid)
    assert len(steps) == 300 and {(s.sample_id, s.index) for s in steps} == {(i, j) for i in sids for j in range(6)}
    assert {s.status for s in steps} == {"completed"} and {s.request["i"] for s in steps} == set(range(6))
    assert all(s.steps_done == 6 and s.last_worker == "w0" for s in store.samples(bid))
    assert writer.stats.folded + writer.stats.running_rows == 300  # every begin written once or folded
    assert writer.stats.groups < 300 and writer.stats.largest_group > 1  # many steps per transaction
    assert writer.stats.retried_groups == 0  # mixed rows commit as one group, not one by one
    assert {s.prompt_tokens for s in steps if s.index % 2 == 0} == {10}


def test_a_long_step_is_a_running_row_while_it_runs(store: Store) -> None:
    """An attempt still running `show_after_s` after it began gets its `running` row (so `status`
    counts it in flight); its completion updates that row: one row per attempt either way."""
    bid, sids = new_batch(store, 1)
    long, short = attempt(bid, sids[0], 0), attempt(bid, sids[0], 1)

    async def main() -> tuple[int, int, StepWriter]:
        async with StepWriter(store, show_after_s=0.05) as writer:
            writer.record(long.begun())
            rows = await asyncio.to_thread(wait_until, lambda: store.steps(bid), 60, "the running row")
            in_flight = estimate_eta(store, bid).steps_running
            await writer.commit(long.completed(outcome(0), steps_done=1))
            writer.record(short.begun())
            await writer.commit(short.completed(outcome(1), steps_done=2))
        return rows[0].id, in_flight, writer

    running_id, in_flight, writer = asyncio.run(main())
    assert in_flight == 1
    first, second = store.steps(bid)
    assert (first.id, first.status, first.request, first.prompt_tokens) == (running_id, "completed", {"i": 0}, 10)
    assert second.status == "completed" and estimate_eta(store, bid).steps_running == 0
    assert writer.stats.running_rows >= 1 and store.samples(bid)[0].steps_done == 2


def test_posted_gateway_writes_refer_to_a_sample_row_written_in_order(store: Store) -> None:
    """The gateway's way: a sample row appended by a job, then attempts of that sample that refer to it
    before it is written (SampleRef), all posted (nothing awaited); closing commits everything."""
    bid = store.create_batch("gw", {}, [])
    ref = SampleRef()

    async def main() -> None:
        writer = StepWriter(store).start()
        created = writer.submit(gateway_records.add_sample, ref, bid, "conversation-1")
        writer.submit(gateway_records.admit_sample_at, ref, 100.0)
        failed, retried = attempt(bid, ref, 0), attempt(bid, ref, 0, 2)
        for write in (failed.begun(), failed.failed("w0: ConnectError"), retried.begun(),
                      retried.completed(outcome(0), steps_done=1)):
            writer.record(write)
        await writer.aclose()
        assert created.result() == ref.id

    asyncio.run(main())
    [sample] = store.samples(bid)
    assert (sample.task_id, sample.status, sample.admitted_at, sample.steps_done) == ("conversation-1", "running",
                                                                                       100.0, 1)
    assert [(s.sample_id, s.attempt, s.status) for s in store.steps(bid)] == [(sample.id, 1, "failed"),
                                                                             (sample.id, 2, "completed")]


def test_bad_row_fails_only_its_writer(store: Store) -> None:
    bid, sids = new_batch(store, 3)

    async def main() -> list[BaseException | None]:
        async with StepWriter(store) as writer:
            results = await asyncio.gather(
                writer.commit(attempt(bid, sids[0], 0).completed(outcome(0), steps_done=1)),
                writer.commit(attempt(bid, sids[1], 0).completed(outcome(0, {"x": object()}), steps_done=1)),
                writer.commit(attempt(bid, sids[2], 0).completed(outcome(0), steps_done=1)),
                return_exceptions=True,
            )
        return list(results)

    ok0, bad, ok2 = asyncio.run(main())
    assert ok0 is None and ok2 is None and isinstance(bad, Exception)
    assert sorted(s.sample_id for s in store.steps(bid)) == [sids[0], sids[2]]
    assert [s.steps_done for s in store.samples(bid)] == [1, 0, 1]  # the failed step did not advance its sample


def test_a_row_reads_back_as_written(store: Store) -> None:
    """Every kind of value round-trips exactly (on PostgreSQL the rows go in by COPY): text that needs
    escaping, exact floats, JSON with nesting and unicode, a JSON column given None, NULL columns."""
    bid, sids = new_batch(store, 1)
    step = StepAttempt(batch_id=bid, sample=sids[0], index=0, attempt=1, kind="environment", enqueued_at=0.1 + 0.2,
                       started_at=1733363456.123456789, worker="w\t0 \u00e9\n", request=None)
    response = {"messages": [{"role": "tool", "content": "a\tb\\N\n\r\"q\" \u2603 \\"}], "n": [1.5e-300, None, True]}

    async def main() -> None:
        async with StepWriter(store) as writer:
            await writer.commit(step.completed(StepOutcome(response=response, tool_calls=3, prefill_s=1 / 3),
                                               steps_done=1, finished_at=2.5))

    asyncio.run(main())
    (row,) = store.steps(bid)
    assert (row.worker, row.request, row.response, row.tool_calls) == ("w\t0 \u00e9\n", None, response, 3)
    assert (row.enqueued_at, row.started_at, row.finished_at, row.prefill_s) == (0.1 + 0.2, 1733363456.123456789, 2.5, 1 / 3)
    assert (row.prompt_tokens, row.error, row.status) == (None, None, "completed")


def test_sample_values_of_a_group_set_nulls_and_keep_a_worker(store: Store) -> None:
    """A group's sample values (on PostgreSQL one statement over arrays): values and NULLs set, the
    last worker kept when none is given, samples of the group with other columns apart."""
    bid, sids = new_batch(store, 3)

    async def main() -> None:
        async with StepWriter(store) as writer:
            await asyncio.gather(*(writer.update_sample(s, {"in_flight_step": 3, "last_worker": f"w{s}", "score": 0.5})
                                   for s in sids))
            await asyncio.gather(*(writer.update_sample(s, {"in_flight_step": None, "last_worker": None, "score": None,
                                                            "status": SampleStatus.RUNNING}) for s in sids[:2]),
                                 writer.update_sample(sids[2], {"steps_done": 7}))

    asyncio.run(main())
    rows = [(s.in_flight_step, s.last_worker, s.score, s.status, s.steps_done) for s in store.samples(bid)]
    assert rows == [(None, f"w{sids[0]}", None, "running", 0), (None, f"w{sids[1]}", None, "running", 0),
                    (3, f"w{sids[2]}", 0.5, "pending", 7)]


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
            write = asyncio.ensure_future(writer.commit(attempt(bid, sids[0], 0).completed(outcome(0), steps_done=1)))
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
    assert [s.status for s in store.steps(bid)] == [StepStatus.COMPLETED]
    store.close()


def test_closed_writer_refuses(store: Store) -> None:
    async def main() -> None:
        writer = StepWriter(store).start()
        await writer.aclose()
        with pytest.raises(RuntimeError, match="not running"):
            await writer.update_sample(1, {"status": "running"})
        writer.record(attempt(1, 1, 0).cancelled())  # posted after close (a late cancellation): dropped

    asyncio.run(main())


def test_posted_writes_from_many_threads_are_all_committed_in_order(store: Store) -> None:
    """The hand-off wakes the thread only when a write cannot wait: a posted write after an idle spell
    is committed without any other write or a close, and writes posted from several threads right
    before `close` are all committed once, each thread's sample updates in the order it posted them."""
    bid, sids = new_batch(store, 4)
    writer = StepWriter(store, group_delay_s=0.01).start()
    lone = attempt(bid, sids[0], 0)
    writer.record(lone.completed(outcome(0), steps_done=1))  # the thread sleeps with nothing due: it is woken
    wait_until(lambda: store.steps(bid), 60, "the lone posted write")

    def post(sid: int) -> None:
        for index in range(1, 301):
            step = attempt(bid, sid, index)
            writer.record(step.begun())
            writer.record(step.completed(outcome(index), steps_done=index))

    threads = [threading.Thread(target=post, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    steps = store.steps(bid)
    assert len(steps) == 1 + 4 * 300 and {s.status for s in steps} == {"completed"}
    assert len({(s.sample_id, s.index, s.attempt) for s in steps}) == len(steps)  # none written twice
    assert [s.steps_done for s in store.samples(bid)] == [300] * 4  # the last update of each sample won
