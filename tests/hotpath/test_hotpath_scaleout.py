"""Scale-out: two `agentbatch join` processes drive one batch through one PostgreSQL store; one is
killed with SIGKILL mid-batch; the other takes its samples over and finishes the batch. Every sample
completes once, no (sample, step) completes twice, no step completed before the kill runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agentbatch.db.models import Sample
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.postgres, pytest.mark.slow]

CONFIG = {
    "name": "scaleout",
    "workload": {"kind": "bfcl", "params": {"limit": 16, "seed": 7}},
    "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 1.0}}},
    "scheduling": {"max_active_samples": 3, "env_slots": 2, "per_worker_inflight": 2},
}


def join(db: str, batch_id: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentbatch.flows.cli", "join", str(batch_id), "--chunk", "3", "--poll", "0.5",
         "--no-progress"],
        env={**os.environ, "AGENTBATCH_DB_URL": db}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


def completed(store: Store, batch_id: int) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for st in store.steps(batch_id):
        if st.status == "completed":
            assert (st.sample_id, st.index) not in out, f"step {(st.sample_id, st.index)} completed twice"
            out[(st.sample_id, st.index)] = st.id
    return out


def leased_by(store: Store, batch_id: int, pid: int) -> set[int]:
    return {s.id for s in store.samples(batch_id)
            if isinstance(s, Sample) and s.lease_owner and s.lease_owner.split(":")[1] == str(pid)
            and s.status in ("pending", "running")}


def test_two_workers_one_killed(pg_url: str) -> None:
    store = Store(pg_url)
    batch_id = create_batch(BatchConfig.model_validate(CONFIG), store)
    first, second = join(pg_url, batch_id), join(pg_url, batch_id)
    try:
        deadline = time.time() + 240
        while True:  # both at work: each holds samples, and some steps are done
            held_first, held_second = leased_by(store, batch_id, first.pid), leased_by(store, batch_id, second.pid)
            if held_first and held_second and len(completed(store, batch_id)) >= 10:
                break
            assert first.poll() is None and second.poll() is None, "a worker ended before the kill"
            assert time.time() < deadline, "the two workers did not both get going"
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        orphaned = leased_by(store, batch_id, first.pid)  # unfinished when it died (nobody took them yet)
        before = completed(store, batch_id)
        out, _ = second.communicate(timeout=300)
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert second.returncode == 0, out
    assert orphaned, "the killed worker held no unfinished sample"

    samples = store.samples(batch_id)
    assert all(s.status == "completed" and s.score == 1.0 for s in samples), [(s.id, s.status) for s in samples]
    assert all(s.lease_owner is None for s in samples)
    after = completed(store, batch_id)  # asserts no (sample, step) completed twice
    assert all(after[key] == row for key, row in before.items())  # nothing completed was run again
    for s in samples:  # each chain complete and gap-free
        assert sorted(i for sid, i in after if sid == s.id) == list(range(s.steps_done))
    assert store.get_batch(batch_id).status == "completed"
    store.close()
