"""`scheduling.policy` in a live batch: auto simulates the portfolio on the earlier batches of the same
tasks and runs the choice (kept in the stored config: a resume runs it again, the report shows it);
a candidate's name runs that candidate; without an engine model auto says why and runs the config."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agentbatch.db.store import Store
from agentbatch.flows.cli import main as cli
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.policy_choice import choice_markdown, choose_policy
from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.traces import generate, write_trace

NAMES = {c.name: c for c in BUILTIN_CANDIDATES}


def _replay(trace: Path, db: str, policy: str) -> None:
    assert cli(["replay", str(trace), "--mode", "live", "--engine", "simulated", "--workers", "2",
                "--time-scale", "0.005", "--env-slots", "2", "--max-active", "4", "--policy", policy, "--db", db]) == 0


def test_auto_chooses_from_history_and_a_name_runs_that_candidate(tmp_path: Path, sqlite_url: str) -> None:
    trace = tmp_path / "m.parquet"
    write_trace(generate("mcp_like", 6, seed=7), trace)
    _replay(trace, sqlite_url, "configured")  # the history
    _replay(trace, sqlite_url, "auto")
    _replay(trace, sqlite_url, "decoupled FIFO, all admitted")
    store = Store(sqlite_url)
    try:
        first, auto, named = (b.config["scheduling"] for b in store.list_batches())
        assert first["policy"] == "configured" and first["choice"] is None and first["max_active_samples"] == 4
        choice = auto["choice"]
        assert choice["mode"] == "auto" and choice["members"] == 1 and choice["chosen"] in NAMES
        assert auto["policy"] == choice["chosen"]
        assert {r["name"] for r in choice["candidates"]} >= {c.name for c in BUILTIN_CANDIDATES if c.baseline}
        picked = NAMES[choice["chosen"]]
        picked = picked if auto["priors"] else picked.without_priors()  # as it runs without priors
        assert auto["coupled"] == picked.coupled and auto["env_queue"]["name"] == picked.env_queue
        assert auto["admission_control"] == picked.admission_control
        assert "policy auto" in choice_markdown(choice) and choice["chosen"] in choice_markdown(choice)
        assert named["policy"] == "decoupled FIFO, all admitted" and named["coupled"] is False
        assert named["max_active_samples"] == 6 and named["env_queue"]["name"] == "fifo" and named["priors"] == {}
        assert all(s.status == "completed" for b in store.list_batches() for s in store.samples(b.id))
    finally:
        store.close()


def test_auto_without_an_engine_model_runs_the_configured_policy() -> None:
    config = BatchConfig.model_validate({"engine": {"kind": "scripted"}})
    assert config.scheduling.policy == "auto"  # the default
    choice = choose_policy(config, store=None, batch_id=1, task_ids=["a", "b"], workers=1, priors={})
    assert choice.config is config
    assert choice.summary["chosen"] == "configured" and "no simulated timing profile" in choice.summary["reason"]


def test_an_unknown_policy_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="scheduling.policy"):
        BatchConfig.model_validate({"scheduling": {"policy": "fastest please"}})


def test_the_choice_simulates_the_runner_the_history_recorded() -> None:
    from agentbatch.flows.policy_choice import engine_base
    from agentbatch.traces import Trace, TraceSample, TraceStep

    def sample(i: int, t0: float) -> TraceSample:
        # the call took 20 ms beyond the engine's own 80 ms; its tool step was queued 10 ms after it ended
        call = TraceStep(index=0, kind="inference", duration_s=0.1, prefill_s=0.03, decode_s=0.05, engine_queue_s=0.0,
                         enqueued_at=t0, started_at=t0, finished_at=t0 + 0.1)  # fmt: skip
        tool = TraceStep(index=1, kind="environment", duration_s=1.0, enqueued_at=t0 + 0.11, started_at=t0 + 0.11,
                         finished_at=t0 + 1.11)  # fmt: skip
        return TraceSample(index=i, task_id=f"t{i}", steps=[call, tool], admitted_at=0.0, finished_at=t0 + 1.11)

    history = Trace(samples=[sample(0, 0.5), sample(1, 0.504), sample(2, 0.508)])  # chains started 4 ms apart
    # openai workers described by their speed (a serve-sim pool at a tenth of real time)
    config = BatchConfig.model_validate({"engine": {"kind": "openai", "params": {
        "endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "timing": {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 0.1}}}})  # fmt: skip
    base = engine_base(config, 2, [history])
    # wall seconds / the engines' time scale: (20 + 10) ms over two steps = 15 ms a step
    assert base.step_latency_s == pytest.approx(0.15) and base.sample_start_s == pytest.approx(0.04)
    assert base.env_time_scale == pytest.approx(10.0) and base.workers == 2
    assert engine_base(config, 2, []).step_latency_s == 0.0  # no history: nothing measured
