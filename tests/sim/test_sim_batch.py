"""End to end: a BFCL batch whose engine workers are the simulated engine in real time (Prefect
flow, store), then `agentbatch calibrate` on the recorded batch."""

from __future__ import annotations

import pytest

from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, run_flow
from agentbatch.flows.cli import main
from agentbatch.flows.config import BatchConfig
from agentbatch.sim import get_profile

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_bfcl_batch_on_simulated_workers_records_cache_hits_and_calibrates(sqlite_url, tmp_path, capsys):
    cfg = BatchConfig.model_validate(
        {
            "name": "sim-workers",
            "workload": {"kind": "bfcl", "params": {"limit": 8, "seed": 5}},
            "engine": {
                "kind": "scripted",
                "params": {
                    "workers": 2,
                    "timing": {"kind": "simulated", "profile": "tiny-cpu", "time_scale": 0.05},
                },
            },
            "scheduling": {"max_active_samples": 8, "env_slots": 4, "per_worker_inflight": 4},
            "execution": {"mode": "lean"},
        }
    )
    store = Store(sqlite_url)
    batch_id = create_batch(cfg, store)
    run_flow(store, batch_id, show_progress=False)
    samples = store.samples(batch_id)
    assert all(s.status == "completed" and s.score == 1.0 for s in samples)  # timing does not change answers
    inference = [st for st in store.steps(batch_id) if st.kind == "inference"]
    assert all(st.prefill_s is not None and st.prefill_s > 0 for st in inference)
    later_turns = [st for st in inference if st.index > 0]
    # a sample's later turns find its earlier prompt cached on its worker, in whole 128-token blocks
    assert later_turns and sum(st.cached_prompt_tokens or 0 for st in later_turns) > 0
    assert all((st.cached_prompt_tokens or 0) % 128 == 0 for st in inference)
    store.close()

    out = tmp_path / "fitted.json"
    rc = main(
        ["calibrate", "--batch", str(batch_id), "--db", sqlite_url, "--base", "tiny-cpu", "--out", str(out)]
    )
    assert rc == 0
    assert "c_prefill" in capsys.readouterr().out
    assert get_profile(str(out)).block_size == 128
