"""Finding 2: a process paused past its lease never overwrites what the process that took over wrote.

Real processes on real SQLite and PostgreSQL: a `join` worker is stopped (SIGSTOP) while it drives
samples, stays stopped past its lease's expiry (AGENTBATCH_LEASE_TTL_S=3), a `resume` takes the
samples over and completes them; the worker is then continued (SIGCONT). Every write it still had
for those samples fails the fencing check (`samples.lease_token`), it lets them go and exits 0:
the samples, their scores and their steps are the taker's, byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import bfcl_config, completions, start_cli
from sqlalchemy import update
from sqlalchemy.exc import DBAPIError

from agentbatch.db.fencing import locked_tokens
from agentbatch.db.leases import MAY_HAVE_EXECUTED, LeaseLost, SampleLeases, flag_in_flight
from agentbatch.db.models import Sample, Step
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.leased import LeaseKeeper
from agentbatch.protocols.environment import UNSAFE_CALLS

TTL_S = 3.0


def outcome(store: Store, batch_id: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    samples = [(s.id, s.status, s.score, s.error, s.finished_at, s.steps_done) for s in store.samples(batch_id)]
    steps = [(st.id, st.sample_id, st.index, st.attempt, st.status, st.finished_at) for st in store.steps(batch_id)]
    return samples, steps


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_paused_worker_lets_go_of_samples_taken_over(db_url: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBATCH_LEASE_TTL_S", str(TTL_S))  # both processes' leases
    store = Store(db_url)
    # slow steps (scale 10): a sample is mid-chain for seconds, so the pause catches steps in flight
    batch_id = create_batch(BatchConfig.model_validate(bfcl_config("fenced", limit=3, scale=10.0)), store)
    stalled_log, taker_log = tmp_path / "stalled.log", tmp_path / "taker.log"
    stalled = start_cli(["join", str(batch_id), "--chunk", "3", "--poll", "0.5", "--no-progress"], db_url,
                        start_new_session=True,
                        stdout=stalled_log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(completions(store, batch_id)) >= 2 or stalled.poll() is not None, 300, "first steps")
        os.killpg(stalled.pid, signal.SIGSTOP)
        held = {s.id for s in store.samples(batch_id) if s.status in ("pending", "running")}
        assert held, "the worker finished before it was paused"
        time.sleep(TTL_S + 1)  # its leases expire while it is stopped
        taker = start_cli(["resume", str(batch_id), "--no-progress"], db_url, stdout=taker_log.open("w"),
                          stderr=subprocess.STDOUT)
        assert taker.wait(timeout=600) == 0, taker_log.read_text()
        taken = outcome(store, batch_id)
        assert all(s[1] == "completed" for s in taken[0]), taken[0]
    finally:
        os.killpg(stalled.pid, signal.SIGCONT)
    assert stalled.wait(timeout=300) == 0, stalled_log.read_text()
    assert outcome(store, batch_id) == taken  # nothing the stalled worker still had was written
    assert "driven by another process" in stalled_log.read_text()
    assert store.get_batch(batch_id).status == "completed"
    store.close()


@pytest.mark.postgres
def test_a_stalled_transaction_does_not_keep_expired_leases_locked(pg_url: str) -> None:
    """A holder stopped inside a transaction that locks its samples' rows (a SIGSTOP between a fenced
    write's lock and its commit): the server ends that transaction once it has been idle a third of the
    lease's time to live, so a process taking over the expired leases gets the samples instead of
    skipping them as locked (and finishing with nothing to do while they stay unfinished)."""
    holder_store, taker_store = Store(pg_url), Store(pg_url)
    batch_id = holder_store.create_batch("stall", {}, [(f"t{i}", {}) for i in range(2)])
    now = [time.time()]
    holder = SampleLeases(holder_store, batch_id, owner="elsewhere:1:a", ttl_s=3, clock=lambda: now[0])
    holder.claim()
    with holder_store.session() as stalled:
        assert set(locked_tokens(stalled.connection(), holder.tokens)) == set(holder.tokens)
        time.sleep(1.5)  # stopped past the bound (3 s / 3)
        now[0] += 3.5  # and past the leases' expiry
        taker = SampleLeases(taker_store, batch_id, owner="elsewhere:2:b", ttl_s=3, clock=lambda: now[0])
        assert {s.id for s in taker.claim()} == set(holder.tokens)
        with pytest.raises(DBAPIError):  # continued: its transaction is gone, nothing it writes applies
            stalled.execute(update(Sample).where(Sample.batch_id == batch_id).values(score=1.0))
    assert {s.lease_owner for s in taker_store.samples(batch_id)} == {"elsewhere:2:b"}
    holder_store.close()
    taker_store.close()


def test_writer_applies_nothing_for_a_sample_taken_over(store: Store) -> None:
    """The check is in the write's own transaction: of one group, the write for the sample taken
    over fails with LeaseLost (for its coroutine only) and changes nothing; the other one commits."""
    batch_id = store.create_batch("fence", {}, [(f"t{i}", {}) for i in range(2)])
    now = [1000.0]
    a = SampleLeases(store, batch_id, owner="elsewhere:1:a", ttl_s=10, clock=lambda: now[0])
    b = SampleLeases(store, batch_id, owner="elsewhere:2:b", ttl_s=10, clock=lambda: now[0])
    first, second = (s.id for s in a.claim())
    tokens = dict(a.tokens)
    now[0] += 11  # a stalled past its leases: b takes both over, each token moves on
    b.claim()
    assert all(b.tokens[sid] == tokens[sid] + 1 for sid in tokens)
    a.tokens[second] = b.tokens[second]  # pretend a still held this one: its write must go through

    async def write() -> list[BaseException | None]:
        async with StepWriter(store) as writer:
            writer.fences = a.tokens
            done = await asyncio.gather(
                writer.update_sample(first, {"status": "failed", "error": "stalled writer"}),
                writer.update_sample(second, {"steps_done": 7}), return_exceptions=True)
        return list(done)

    lost, ok = asyncio.run(write())
    assert isinstance(lost, LeaseLost) and lost.sample_id == first and ok is None
    rows = {s.id: s for s in store.samples(batch_id)}
    assert rows[first].status == "pending" and rows[first].error is None
    assert rows[second].steps_done == 7


def test_stale_token_settles_flags_and_abandons_nothing(store: Store) -> None:
    """Every write a resume makes for its samples before they run (steps left `running` marked
    abandoned, a step left in flight flagged, a sample stopped for a check) is fenced like the step
    writer's: a process whose leases were taken over changes nothing; the current holder can."""
    batch_id = store.create_batch("fence", {}, [("a", {}), ("b", {})])
    a, b = store.samples(batch_id)
    with store.session() as s, s.begin():
        for sample in (a, b):
            s.get_one(Sample, sample.id).in_flight_step = 1
            s.add(Step(batch_id=batch_id, sample_id=sample.id, index=1, kind="environment", attempt=1,
                       status="running", enqueued_at=0.0, started_at=0.0,
                       request={"from_step": 0, UNSAFE_CALLS: ["refund"]}))
    now = [1000.0]
    stale = LeaseKeeper(store, batch_id, ttl_s=10)
    stale.leases = SampleLeases(store, batch_id, owner="elsewhere:1:a", ttl_s=10, clock=lambda: now[0])
    claimed = stale.claim()
    taker = SampleLeases(store, batch_id, owner="elsewhere:2:b", ttl_s=10, clock=lambda: now[0])
    now[0] += 11  # the first process stalled past its leases: the taker claims both
    taker.claim()
    before = outcome(store, batch_id)
    flags = [(s.id, s.in_flight_step) for s in store.samples(batch_id)]

    assert store.abandon_running(batch_id, stale.fences(claimed)) == 0
    assert flag_in_flight(store, stale.fences(claimed)) == []
    assert [s.id for s in stale.settle_in_flight(claimed, "retry")] == [a.id, b.id]  # nothing settled here
    assert not store.finish_sample(a.id, score=None, result=None, error="stalled", token=stale.fences(claimed)[a.id])
    assert outcome(store, batch_id) == before
    assert [(s.id, s.in_flight_step) for s in store.samples(batch_id)] == flags

    # the holder's own token goes through: the steps are flagged, the unsafe one stops its sample
    holder = LeaseKeeper(store, batch_id, ttl_s=10)
    holder.leases = taker
    assert holder.settle_in_flight(taker.claim(), "retry") == []
    rows = {s.id: s for s in store.samples(batch_id)}
    assert rows[a.id].status == rows[b.id].status == "failed" and rows[a.id].in_flight_step is None
    assert [st.error for st in store.steps(batch_id)] == [MAY_HAVE_EXECUTED, MAY_HAVE_EXECUTED]
