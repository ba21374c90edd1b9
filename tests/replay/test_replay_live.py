"""Controlled replay, live: the recorded environment and the replay engine, directly and through the
Prefect batch flow against the real-time simulated engine's HTTP server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentbatch.db.store import Store
from agentbatch.db.trace_io import export_batch
from agentbatch.engines.replay import ReplayMismatch, build_replay_workers
from agentbatch.environments.recorded import RecordedWorkload
from agentbatch.flows.batch import create_batch, run_batch, run_flow
from agentbatch.flows.cli import main as cli
from agentbatch.flows.config import BatchConfig
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import RecordedTurn
from agentbatch.traces import generate, read_trace, write_trace
from agentbatch.traces.conversation import assistant_message, observation_messages


async def _drive(workload: RecordedWorkload, engine) -> list[tuple[dict, list[dict]]]:  # noqa: ANN001
    """A minimal agent loop over every task: (score, conversation) per sample."""
    out = []
    for task in workload.tasks():
        env = workload.create(task)
        reset = await env.reset(task)
        messages = list(reset.messages)
        for step in range(10_000):
            res = await engine.complete(ChatRequest(messages=messages, tools=reset.tools, task_id=task.task_id,
                                                    step_index=2 * step))
            messages.append(res.message)
            er = await env.step(res.message)
            messages.extend(er.messages)
            if er.done:
                break
        out.append((await env.score(), messages))
    return out


def test_recorded_environment_and_replay_engine_keep_the_recording(tmp_path: Path) -> None:
    trace = generate("mcp_like", 6, seed=9, tasks=3)  # repeated task ids: "#1" disambiguates
    write_trace(trace, tmp_path / "t.parquet")
    workload = RecordedWorkload(str(tmp_path / "t.parquet"), time_scale=0.0)
    assert [t.task_id for t in workload.tasks()][3:] == [f"{s.task_id}#1" for s in trace.samples[3:]]
    [engine] = build_replay_workers({"timing": {"kind": "token", "scale": 0.0}}, workload)
    results = asyncio.run(_drive(workload, engine))
    for s, (score, messages) in zip(trace.samples, results, strict=True):
        assert score["score"] == s.score
        expect = []
        for st in s.steps:
            expect += [assistant_message(s, st)] if st.kind == "inference" else observation_messages(s, st)
        assert messages[2:] == expect  # the conversation is the recorded one
    with pytest.raises(ReplayMismatch):  # a call past the recording
        too_long = [{"role": "assistant", "content": "x"}] * 100
        asyncio.run(engine.complete(ChatRequest(messages=too_long, tools=[], task_id=workload.tasks()[0].task_id)))


def test_replay_engine_needs_the_recorded_workload() -> None:
    with pytest.raises(ValueError, match="recorded"):
        build_replay_workers({}, object())


def test_cli_trace_and_virtual_replay(tmp_path: Path, sqlite_url: str, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "g.parquet"
    assert cli(["trace", "generate", "bfcl_like", "--samples", "20", "--seed", "2", "--out", str(out)]) == 0
    assert cli(["trace", "import", str(out), "--db", sqlite_url]) == 0
    assert cli(["trace", "export", "1", "--out", str(tmp_path / "e.parquet"), "--db", sqlite_url]) == 0
    assert [s.score for s in read_trace(tmp_path / "e.parquet").samples] == [s.score for s in read_trace(out).samples]
    capsys.readouterr()
    args = ["replay", str(out), "--router", "trajectory_aware", "--env-queue", "caas", "--env-slots", "2",
            "--max-active", "8", "--workers", "2", "--policy-param", "router.balance_abs=8", "--json"]
    assert cli(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert cli(args) == 0
    second = json.loads(capsys.readouterr().out)
    first.pop("sim_wall_s"), second.pop("sim_wall_s")
    assert first == second  # deterministic
    assert first["mean_score"] == first["recorded_score"] and first["makespan_s"] >= first["lower_bound_s"]
    assert cli(["replay", str(out), "--router", "nope"]) == 2
    assert cli(["trace", "export", "99", "--out", str(tmp_path / "x.parquet"), "--db", sqlite_url]) == 2


def _bfcl_config(limit: int) -> BatchConfig:
    return BatchConfig.model_validate({
        "name": "record-bfcl",
        "workload": {"kind": "bfcl", "params": {"limit": limit, "seed": 5}},
        "engine": {"kind": "scripted", "params": {"workers": 1, "timing": {"kind": "token", "scale": 0.05}}},
        "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 4},
    })


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_live_replay_of_a_recorded_bfcl_batch_through_the_http_server(sqlite_url: str, tmp_path: Path) -> None:
    from agentbatch.engines.sim_server import running_sim_server

    store = Store(sqlite_url)
    recorded_id = create_batch(_bfcl_config(4), store)
    run_flow(store, recorded_id, show_progress=False)
    trace = export_batch(store, recorded_id)
    assert all(s.status == "completed" for s in trace.samples)
    write_trace(trace, tmp_path / "bfcl.parquet")
    with running_sim_server("llama3-8b-h100", time_scale=0.02) as url:
        config = BatchConfig.model_validate({
            "name": "replay-bfcl",
            "workload": {"kind": "recorded", "params": {"trace": str(tmp_path / "bfcl.parquet"), "time_scale": 1.0}},
            "engine": {"kind": "replay", "params": {"endpoints": [{"base_url": url, "model": "llama3-8b-h100"}]}},
            "scheduling": {"max_active_samples": 4, "env_slots": 1, "env_queue": {"name": "caas"},
                           "router": {"name": "trajectory_aware"}},
        })
        replay_id = run_batch(config, store, show_progress=False)
    replay = export_batch(store, replay_id)
    assert [s.score for s in replay.samples] == [s.score for s in trace.samples]  # recorded scores
    assert [s.task_id for s in replay.samples] == [s.task_id for s in trace.samples]
    for a, b in zip(trace.samples, replay.samples, strict=True):
        assert [(x.kind, x.message, x.observation) for x in a.steps] == [(y.kind, y.message, y.observation) for y in b.steps]
        # the engine really ran: forced to the recorded output lengths, prompts re-tokenized
        assert [y.output_tokens for y in b.inference_steps] == [x.output_tokens for x in a.inference_steps]
        assert all(y.prompt_tokens and y.worker == "worker-0" for y in b.inference_steps)
    # the recorded batch also replays in virtual time (recorded prompts, outputs and tool durations)
    from agentbatch.sim.virtual_time import VirtualConfig, simulate

    virtual = simulate(trace, VirtualConfig(workers=2, env_slots=1, max_active=4))
    assert virtual.summary.mean_score == pytest.approx(sum(s.score for s in trace.samples) / len(trace.samples))
    assert virtual.summary.steps == trace.num_steps and virtual.summary.lb_ratio >= 1.0
    env = sorted((st.started_at, st.finished_at) for s in replay.samples for st in s.environment_steps)
    assert all(env[i][1] <= env[i + 1][0] + 1e-6 for i in range(len(env) - 1))  # one env slot: never overlap
    store.close()


def test_recorded_environment_restore_continues_after_the_given_turns(tmp_path: Path) -> None:
    trace = generate("swe_like", 2, seed=4)
    workload = RecordedWorkload(trace, time_scale=0.0)
    task = workload.tasks()[0]
    sample = trace.samples[0]
    env = workload.create(task)
    asyncio.run(env.reset(task))
    assistants = [assistant_message(sample, st) for st in sample.inference_steps[:2]]
    asyncio.run(env.restore([RecordedTurn(a, []) for a in assistants]))
    res = asyncio.run(env.step(assistants[-1]))
    assert res.messages == observation_messages(sample, sample.environment_steps[2])
    assert res.info["recorded_step"] == sample.environment_steps[2].index


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_cli_live_replay_with_the_simulated_engine(tmp_path: Path, sqlite_url: str, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "m.parquet"
    write_trace(generate("mcp_like", 5, seed=3), out)
    args = ["replay", str(out), "--mode", "live", "--engine", "simulated", "--workers", "2",
            "--time-scale", "0.01", "--router", "trajectory_aware", "--env-queue", "caas",
            "--priority", "chain_progress", "--env-slots", "2", "--max-active", "5", "--db", sqlite_url]
    assert cli(args) == 0
    assert "scores equal to the recording: 5/5" in capsys.readouterr().out
    store = Store(sqlite_url)
    [batch] = store.list_batches()
    steps = store.steps(batch.id)
    assert {st.worker for st in steps if st.kind == "inference"} <= {"replay-0", "replay-1"}
    assert len(steps) == generate("mcp_like", 5, seed=3).num_steps
    store.close()
