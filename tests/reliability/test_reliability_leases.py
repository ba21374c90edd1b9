"""Finding 1 and 6: one process drives a sample at a time (sample leases), whatever the interleaving.

Real processes against real SQLite and PostgreSQL: concurrent claims split the samples, two
concurrent `agentbatch resume` of one batch never complete a step twice, both of them killed leave a
batch that a later resume finishes, and six processes opening a fresh store at once all succeed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import time

import pytest
from reliability_helpers import (
    bfcl_config,
    claim_in_process,
    completions,
    duplicates,
    open_store_in_process,
    start_cli,
)
from testkit import run_cli_here

from agentbatch.db.leases import SampleLeases
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig


def test_concurrent_claims_are_disjoint(store: Store) -> None:
    batch_id = store.create_batch("claims", {}, [(f"t{i}", {}) for i in range(40)])
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=claim_in_process, args=(store.url, batch_id, barrier, out)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    claimed = [sid for _, ids in got for sid in ids]
    assert len(claimed) == len(set(claimed)) == 40  # 6 x 7 wanted, 40 exist: each exactly once
    rows = {s.id: s.lease_owner for s in store.samples(batch_id)}
    for owner, ids in got:
        assert all(rows[sid] == owner for sid in ids)


def test_expired_and_dead_leases_are_taken_over(store: Store) -> None:
    batch_id = store.create_batch("expiry", {}, [(f"t{i}", {}) for i in range(4)])
    now = [1000.0]
    a = SampleLeases(store, batch_id, owner="elsewhere:1:a", ttl_s=10, clock=lambda: now[0])
    b = SampleLeases(store, batch_id, owner="elsewhere:2:b", ttl_s=10, clock=lambda: now[0])
    assert len(a.claim()) == 4 and b.claim() == [] and len(b.foreign()) == 4
    now[0] += 5
    assert a.renew() == {s.id for s in store.samples(batch_id)}  # renewed until 1015
    now[0] += 11  # 1016: a stopped renewing, its leases expired
    assert len(b.claim()) == 4
    assert a.renew() == set()  # a learns it lost them
    b.release(store.samples(batch_id)[0].id)
    assert len(b.held()) == 3
    # a lease of a process on this host that no longer exists is free at once
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = SampleLeases(store, batch_id, owner=f"{socket.gethostname()}:{dead.stdout.strip()}:x", ttl_s=300)
    b.release_all()
    assert len(ghost.claim()) == 4
    fresh = SampleLeases(store, batch_id, ttl_s=300)
    assert len(fresh.claim()) == 4  # ghost's pid is gone: no waiting 300 s


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_two_concurrent_resumes_never_complete_a_step_twice(db_url: str) -> None:
    store = Store(db_url)
    batch_id = create_batch(BatchConfig.model_validate(bfcl_config("twice", limit=10)), store)
    procs = [start_cli(["resume", str(batch_id), "--no-progress"], db_url) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    # one drove the batch; the other took what was unclaimed (exit 0) or found nothing left (exit 2)
    assert codes in ([0, 0], [0, 2]), outs
    if codes == [0, 2]:
        busy = outs[[p.returncode for p in procs].index(2)]
        assert "being run by another process" in busy, busy
    assert duplicates(store, batch_id) == {}
    assert all(s.status == "completed" for s in store.samples(batch_id))
    assert all(s.lease_owner is None for s in store.samples(batch_id))
    assert store.get_batch(batch_id).status == "completed"
    store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_resume_takes_only_unclaimed_samples(db_url: str) -> None:
    store = Store(db_url)
    batch_id = create_batch(BatchConfig.model_validate(bfcl_config("split", limit=6)), store)
    other = SampleLeases(store, batch_id, owner="otherhost:4242:live", ttl_s=3600)
    held = {s.id for s in other.claim(limit=3)}
    done = run_cli_here(["resume", str(batch_id), "--no-progress"], db_url)
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = {s.id: s.status for s in store.samples(batch_id)}
    assert {sid for sid, st in statuses.items() if st == "completed"} == set(statuses) - held
    assert all(statuses[sid] == "pending" for sid in held)
    assert store.get_batch(batch_id).status == "running"  # the other process will finish it
    busy = run_cli_here(["resume", str(batch_id), "--no-progress"], db_url)
    assert busy.returncode == 2 and "being run by another process" in busy.stderr, busy.stdout + busy.stderr
    assert "otherhost:4242:live" in busy.stderr
    other.release_all()
    finished = run_cli_here(["resume", str(batch_id), "--no-progress"], db_url)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert store.get_batch(batch_id).status == "completed"
    assert duplicates(store, batch_id) == {}
    store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_two_resumes_killed_then_a_third_finishes(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(db_url)
    batch_id = create_batch(BatchConfig.model_validate(bfcl_config("killed", limit=12)), store)
    logs = [tmp_path / f"resume{i}.log" for i in range(2)]
    procs = [start_cli(["resume", str(batch_id), "--no-progress"], db_url, start_new_session=True,
                       stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
    deadline = time.time() + 300

    def finished() -> int:
        return sum(s.status == "completed" for s in store.samples(batch_id))

    # both are under way (each drives samples, or found none left and exited), then more steps complete;
    # killed before the batch can end however fast a process runs (one may start long after the other)
    while time.time() < deadline and finished() < 8 and not all(
            p.poll() is not None or "samples to run" in log.read_text() for p, log in zip(procs, logs, strict=True)):
        time.sleep(0.05)
    target = len(completions(store, batch_id)) + 12
    while len(completions(store, batch_id)) < target and finished() < 8 and time.time() < deadline:
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert finished() < 12, "killed too late"
    before = completions(store, batch_id)
    third = run_cli_here(["resume", str(batch_id), "--no-progress"], db_url)
    assert third.returncode == 0, third.stdout + third.stderr
    after = completions(store, batch_id)
    assert duplicates(store, batch_id) == {}
    assert all(after[k] == v for k, v in before.items())  # nothing completed was redone
    assert all(s.status == "completed" and s.score == 1.0 for s in store.samples(batch_id))
    store.close()


def test_concurrent_first_opens_migrate_once(db_url: str) -> None:
    """Six processes open the same fresh store at the same moment: all succeed, one schema."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=open_store_in_process, args=(db_url, barrier, out)) for _ in range(6)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok"] * 6, results
