"""Virtual-time replay: determinism, capacity limits honoured, scores kept, makespan >= lower bound."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from testkit import max_overlap

from agentbatch.sim.profiles import CostModel, EngineProfile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.sim.virtual_time.bounds import trace_lower_bound
from agentbatch.traces import generate
from agentbatch.traces.schema import Trace, TraceSample, TraceStep

BASE = VirtualConfig(workers=2, profile="llama3-8b-h100", env_slots=4, max_active=12, per_worker_inflight=None,
                     router=PolicySpec("round_robin"), env_queue=PolicySpec("fifo"), priority=PolicySpec("fcfs"),
                     admission_order="arrival", admission_control="static")  # the baseline, explicitly
CONFIGS = {
    "coupled_rr": replace(BASE, coupled=True),
    "decoupled_rr": BASE,
    "traj_caas": replace(BASE, router=PolicySpec("trajectory_aware"), env_queue=PolicySpec("caas"),
                         inference_queue=PolicySpec("caas"), priority=PolicySpec("chain_progress")),
    "least_loaded_hist": replace(BASE, router=PolicySpec("least_loaded"), env_queue=PolicySpec("caas_history")),
    "one_inflight_caas": replace(BASE, per_worker_inflight=1, inference_queue=PolicySpec("caas"),
                                 router=PolicySpec("trajectory_aware")),
}


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate("mcp_like", 40, seed=11)


def test_same_trace_twice_gives_identical_results(trace: Trace) -> None:
    cfg = CONFIGS["traj_caas"]
    a, b = simulate(trace, cfg), simulate(trace, cfg)
    assert a.raw.steps == b.raw.steps
    assert a.raw.samples == b.raw.samples
    sa, sb = a.summary.to_dict(), b.summary.to_dict()
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert sa == sb


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_limits_scores_and_bound(trace: Trace, name: str) -> None:
    cfg = CONFIGS[name]
    r = simulate(trace, cfg)
    steps, samples = r.steps_frame(), r.samples_frame()
    assert len(samples) == len(trace.samples)
    assert len(steps) == trace.num_steps  # every recorded step ran exactly once
    assert list(samples["score"]) == [s.score for s in trace.samples]  # scores are the recording's
    env = steps[steps.kind == "environment"]
    assert max_overlap(zip(env.started_at, env.finished_at, strict=True)) <= cfg.env_slots
    limit = min(cfg.max_active, cfg.env_slots) if cfg.coupled else cfg.max_active
    assert max_overlap(zip(samples.admitted_at, samples.finished_at, strict=True)) <= limit
    inflight = cfg.per_worker_inflight or 256
    inf = steps[steps.kind == "inference"]
    for _, w in inf.groupby("worker"):
        assert max_overlap(zip(w.started_at, w.finished_at, strict=True)) <= inflight
    # recorded durations are replayed exactly
    durations = {(s.index, st.index): st.duration_s for s in trace.samples for st in s.environment_steps}
    got = {(int(a), int(b)): f - s for a, b, s, f in env[["sample_id", "index", "started_at", "finished_at"]]
           .itertuples(index=False)}
    assert got == pytest.approx(durations)
    # no schedule beats the lower bound
    assert r.summary.makespan_s >= r.summary.lower_bound_s * (1 - 1e-9)
    assert r.summary.makespan_s == pytest.approx(samples.finished_at.max())


def test_coupled_env_steps_never_wait_and_decoupled_admits_more(trace: Trace) -> None:
    coupled = simulate(trace, CONFIGS["coupled_rr"]).steps_frame()
    env = coupled[coupled.kind == "environment"]
    assert (env.started_at == env.enqueued_at).all()  # the sample holds its slot
    dec = simulate(trace, CONFIGS["decoupled_rr"]).samples_frame()
    assert max_overlap(zip(dec.admitted_at, dec.finished_at, strict=True)) > CONFIGS["coupled_rr"].env_slots


def test_trajectory_routing_keeps_prefixes(trace: Trace) -> None:
    rr = simulate(trace, CONFIGS["decoupled_rr"])
    traj = simulate(trace, replace(BASE, router=PolicySpec("trajectory_aware")))
    assert traj.summary.router["moved"] == 0 and traj.summary.router["sticky"] > 0
    assert traj.summary.cache_hit_rate > rr.summary.cache_hit_rate
    steps = traj.steps_frame()
    inf = steps[steps.kind == "inference"].sort_values(["sample_id", "index"])
    assert inf.groupby("sample_id")["worker"].nunique().max() == 1  # every sample stayed on one worker


def _unit_profile(**kw) -> EngineProfile:
    base = dict(name="unit", block_size=16, num_kv_blocks=10_000, max_num_seqs=1, max_num_batched_tokens=8192,
                state_slots=None, state_checkpoints=0, cost=CostModel(c0=1.0, c_prefill=0.0, c_decode=0.0, c_attn=0.0))
    base.update(kw)
    return EngineProfile(**base)


def test_lower_bound_hand_computed() -> None:
    # c0 = 1 s per iteration, nothing else: an inference call of o output tokens costs 1 + (o - 1) s alone.
    a = TraceSample(0, "a", [TraceStep(0, "inference", 0.0, prompt_tokens=32, output_tokens=3),
                             TraceStep(1, "environment", 10.0, done=True)])
    b = TraceSample(1, "b", [TraceStep(0, "inference", 0.0, prompt_tokens=16, output_tokens=1),
                             TraceStep(1, "environment", 2.0, done=True)])
    trace = Trace([a, b])
    lb = trace_lower_bound(trace, _unit_profile(), workers=1, env_slots=2)
    assert lb.longest_chain_s == pytest.approx(3 + 10)  # a: 1 prefill + 2 decode iterations + 10 s tool
    assert lb.environment_bound_s == pytest.approx(12 / 2)
    assert lb.inference_bound_s == pytest.approx(2.0)  # 2 decode tokens, one sequence per iteration
    assert lb.binding == "chain" and lb.value == pytest.approx(13)
    r = simulate(trace, VirtualConfig(workers=1, profile=_unit_profile(), env_slots=2, max_active=2))
    # one worker, one sequence at a time: a runs 3 iterations, then b 1 -> b's tool ends at 4 + 2
    assert r.summary.makespan_s == pytest.approx(13)
    assert r.summary.lb_ratio == pytest.approx(1.0)
    wide = trace_lower_bound(trace, _unit_profile(max_num_seqs=4), workers=1, env_slots=1)
    assert wide.environment_bound_s == pytest.approx(12) and wide.inference_bound_s == pytest.approx(0.5)  # 2 tokens / 4 seqs


def test_history_admission_order_and_priors(trace: Trace) -> None:
    priors = {s.task_id: float(len(s.steps)) for s in trace.samples}
    cfg = replace(BASE, max_active=2, priors=priors, admission_order="longest_prior_first",
                  env_queue=PolicySpec("caas_history"))
    samples = simulate(trace, cfg).samples_frame().sort_values(["admitted_at", "index"])
    first_two = set(samples["index"][:2])
    longest = sorted(trace.samples, key=lambda s: (-len(s.steps), s.index))[:2]
    assert first_two == {s.index for s in longest}
    with pytest.raises(ValueError, match="admission_order"):
        simulate(trace, replace(BASE, admission_order="random"))


def test_kv_aware_routing_reads_engine_kv_usage(trace: Trace) -> None:
    cfg = replace(BASE, router=PolicySpec("trajectory_aware", {"kv_margin": 0.0, "balance_abs": 10_000}))
    r = simulate(trace, cfg)
    # with a zero KV margin any KV imbalance moves the sample: the metric reached the router
    assert r.summary.router["moved"] > 0
    assert r.summary.mean_score == pytest.approx(np.mean([s.score for s in trace.samples]))


def test_simulated_frames_feed_the_dashboards_analytics(trace: Trace) -> None:
    from agentbatch.dashboards.analytics import BatchAnalysis
    from agentbatch.dashboards.frames import SAMPLE_COLUMNS, STEP_COLUMNS, BatchData

    r = simulate(trace, CONFIGS["traj_caas"])
    steps, samples = r.steps_frame(), r.samples_frame()
    assert set(STEP_COLUMNS) <= set(steps.columns) and set(SAMPLE_COLUMNS) <= set(samples.columns)
    data = BatchData(batch_id=0, name="virtual", status="completed", config={}, created_at=0.0, started_at=0.0,
                     finished_at=r.summary.makespan_s, flow_run_id=None, samples=samples, steps=steps)
    a = BatchAnalysis(data)
    assert a.makespan_s == pytest.approx(r.summary.makespan_s)
    assert len(a.per_sample) == len(trace.samples)
