"""A batch-wide environment-slot limit split among the processes that drive one batch
(`scheduling.env_slots_scope: batch`): two `join` processes on PostgreSQL each run up to their share,
so together they never run more environment actions than the batch's limit once both have started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from testkit import max_overlap

from agentbatch.db.leases import slot_share
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.traces import generate
from agentbatch.traces.parquet import write_trace


def test_slot_share_splits_a_total_among_owners() -> None:
    owners = ["a", "b", "c"]
    assert [slot_share(8, owners, o) for o in owners] == [3, 3, 2]  # the first 8 % 3 get one more
    assert sum(slot_share(8, owners, o) for o in owners) == 8
    assert slot_share(8, ["a"], "a") == 8
    assert [slot_share(2, owners, o) for o in owners] == [1, 1, 1]  # never 0: each process progresses
    assert slot_share(5, ["a", "b"], "z") == 2  # not listed yet: counted last


def _join(db: str, batch_id: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentbatch.flows.cli", "join", str(batch_id), "--chunk", "8", "--poll", "0.5",
         "--no-progress"],
        env={**os.environ, "AGENTBATCH_DB_URL": db},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_two_processes_share_the_batch_env_slots(pg_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "mcp.parquet"
    write_trace(generate("mcp_like", samples=16, seed=3), trace)  # environment steps of ~0.1-1 s
    store = Store(pg_url)
    batch_id = create_batch(BatchConfig.model_validate({
        "name": "slot-share",
        "workload": {"kind": "recorded", "params": {"trace": str(trace), "time_scale": 0.25}},
        "engine": {"kind": "replay", "params": {"inner": "timing", "workers": 2,
                                                "timing": {"kind": "token", "scale": 0.05}}},
        "scheduling": {"max_active_samples": 8, "env_slots": 2, "env_slots_scope": "batch"},
    }), store)
    workers = [_join(pg_url, batch_id), _join(pg_url, batch_id)]
    try:
        outputs = [w.communicate(timeout=400)[0] for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert all(s.status == "completed" for s in store.samples(batch_id))

    # Both processes took their share (1 of 2) once they saw each other; from then on (plus 2 s for
    # actions that were already running to end) the two together never run more than 2 at once.
    shared_at = [_first_line_time(o, "now runs up to 1 of its 2 environment slots") for o in outputs]
    assert all(t is not None for t in shared_at), outputs
    settled = max(t for t in shared_at if t is not None) + 2.0
    env = [(st.started_at, st.finished_at) for st in store.steps(batch_id)
           if st.status == "completed" and st.kind == "environment"]
    assert any(e > settled + 2.0 for _, e in env), "the batch ended before both processes had settled"
    assert max_overlap(env, after=settled) <= 2
    store.close()


def _first_line_time(output: str, text: str) -> float | None:
    """The log time (`%(asctime)s`, local time) of the first line that contains `text`."""
    for line in output.splitlines():
        if text in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return time.mktime(stamp.timetuple()) + stamp.microsecond / 1e6
    return None
