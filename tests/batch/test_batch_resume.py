"""SIGKILL a running batch part-way, resume it: no completed step lost or repeated, same results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.config import BatchConfig

pytestmark = pytest.mark.usefixtures("prefect_api")

CONFIG = {
    "name": "resume-test",
    "workload": {"kind": "bfcl", "params": {"limit": 8, "seed": 11}},
    "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 1.0}}},
    "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 2},
}


def completed_steps(store: Store, batch_id: int) -> dict[tuple[str, int], tuple[int, float, dict]]:
    out = {}
    samples = {s.id: s.task_id for s in store.samples(batch_id)}
    for st in store.steps(batch_id):
        if st.status == "completed":
            key = (samples[st.sample_id], st.index)
            assert key not in out, f"step {key} completed twice"
            out[key] = (st.id, st.finished_at, st.response)
    return out


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'kill.sqlite'}"
    cfg_path = tmp_path / "batch.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "AGENTBATCH_DB_URL": db}
    cmd = [sys.executable, "-m", "agentbatch.flows.cli", "run", str(cfg_path), "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    store = Store(db)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait until the batch is well under way
            batches = store.list_batches()
            if batches and len(completed_steps(store, batches[0].id)) >= 40:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.2)
        else:
            pytest.fail("batch did not get going")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the flow process and its Prefect server
        proc.wait()
    batch_id = store.list_batches()[0].id
    before = completed_steps(store, batch_id)
    counts = store.status_counts(batch_id)
    assert counts.get("completed", 0) < 8, "killed too late to test anything"

    resumed = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "resume", str(batch_id),
                              "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    after = completed_steps(store, batch_id)
    for key, (row_id, finished_at, _) in before.items():  # nothing completed was executed again
        assert after[key][0] == row_id and after[key][1] == finished_at
    assert all(s.status == "completed" and s.score == 1.0 for s in store.samples(batch_id))
    for st in store.steps(batch_id):
        assert st.status in ("completed", "abandoned"), st.status

    # the same batch uninterrupted gives the same conversation, step by step
    clean_id = create_batch(BatchConfig.model_validate(CONFIG), store)
    run_flow(store, clean_id, show_progress=False)
    clean = completed_steps(store, clean_id)
    assert {k: v[2] for k, v in clean.items()} == {k: v[2] for k, v in after.items()}
    assert [(s.task_id, s.score) for s in store.samples(clean_id)] == \
        [(s.task_id, s.score) for s in store.samples(batch_id)]
    store.close()
