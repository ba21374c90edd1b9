"""An MCP batch end to end through the Prefect flow: BFCL backends served by one MCP server per
sample, the scripted engine's ground truth, multi-turn conversations, every sample scored 1.0."""

from __future__ import annotations

import pytest

from agentbatch.db.store import Store
from agentbatch.flows.batch import run_batch
from agentbatch.flows.config import BatchConfig

pytestmark = pytest.mark.slow


def test_bfcl_over_mcp_batch_through_the_flow(sqlite_url: str) -> None:
    config = BatchConfig.model_validate({
        "name": "mcp-e2e",
        "workload": {"kind": "mcp", "params": {"preset": "bfcl", "limit": 3, "max_calls": 2}},
        "engine": {"kind": "scripted", "params": {"workers": 1}},
        "scheduling": {"max_active_samples": 3, "env_slots": 2, "per_worker_inflight": 3},
    })
    store = Store(sqlite_url)
    try:
        batch_id = run_batch(config, store, show_progress=False)
        samples = store.samples(batch_id)
        steps = store.steps(batch_id)
    finally:
        store.close()
    assert len(samples) == 3
    assert all(s.status == "completed" and s.score == 1.0 for s in samples), [(s.task_id, s.error, s.result) for s in samples]
    assert all((s.result or {}).get("turns_done", 0) >= 2 for s in samples)  # several user turns each
    assert sum(st.tool_calls or 0 for st in steps if st.kind == "environment") >= 6
