"""Virtual time's per-step latency (`VirtualConfig.step_latency_s`, the live runner's own time per
step): a sample goes on that much later after each step, on the engine model and with recorded
durations; the step's slot is free meanwhile (a coupled sample keeps its environment slot); 0 changes
nothing. And `sample_start_s`: sample chains start one after another, as the live runner starts them."""

from __future__ import annotations

import pytest

from agentbatch.sim.virtual_time import VirtualConfig, simulate
from agentbatch.traces import generate


@pytest.mark.parametrize("inference", ["engine", "recorded"])
def test_a_lone_chain_is_longer_by_its_steps_times_the_latency(inference: str) -> None:
    trace = generate("swe_like", 1, seed=3)
    steps = trace.num_steps
    cfg = dict(workers=1, profile="llama3-8b-h100", max_active=1, env_slots=1, inference=inference, priors={})
    base = simulate(trace, VirtualConfig(**cfg)).summary.makespan_s
    late = simulate(trace, VirtualConfig(**cfg, step_latency_s=0.25)).summary.makespan_s
    # one sample alone: nothing waits for anything, so each step adds exactly its latency
    assert late == pytest.approx(base + 0.25 * steps, rel=1e-9)


def test_the_latency_holds_the_slot_of_a_coupled_sample() -> None:
    trace = generate("swe_like", 4, seed=3)
    cfg = dict(workers=1, profile="llama3-8b-h100", max_active=2, env_slots=2, coupled=True, priors={},
               admission_control="static")  # fmt: skip
    base = simulate(trace, VirtualConfig(**cfg)).summary
    late = simulate(trace, VirtualConfig(**cfg, step_latency_s=0.25)).summary
    # coupled at 2 slots: the 4 chains run two at a time, each step of each on the critical path of its
    # slot, so the batch grows by at least the steps of the slot's chains, not by one chain's
    per_chain = sorted(len(s.steps) for s in trace.samples)
    assert late.makespan_s - base.makespan_s >= 0.25 * (per_chain[0] + per_chain[1]) - 1e-6
    assert simulate(trace, VirtualConfig(**cfg, step_latency_s=0.0)).summary.makespan_s == base.makespan_s


def test_the_latency_does_not_hold_a_shared_environment_slot() -> None:
    trace = generate("swe_like", 8, seed=3)
    cfg = dict(workers=1, profile="llama3-8b-h100", max_active=8, env_slots=1, inference="recorded", priors={},
               admission_control="static")  # fmt: skip
    base = simulate(trace, VirtualConfig(**cfg)).summary.makespan_s
    late = simulate(trace, VirtualConfig(**cfg, step_latency_s=0.25)).summary.makespan_s
    env_steps = sum(1 for s in trace.samples for st in s.steps if st.kind != "inference")
    # one environment slot, eight samples: while one sample is in its latency another's action runs, so
    # the batch grows far less than if every action held the slot for the latency too
    assert base < late < base + 0.5 * 0.25 * env_steps


def test_samples_start_one_after_another() -> None:
    trace = generate("swe_like", 4, seed=3)
    cfg = dict(workers=1, profile="llama3-8b-h100", max_active=4, env_slots=4, inference="recorded", priors={},
               admission_control="static")  # fmt: skip
    r = simulate(trace, VirtualConfig(**cfg, sample_start_s=0.5))
    first = r.steps_frame().groupby("sample_id").enqueued_at.min().sort_values().tolist()
    # admitted together at 0, the four chains' first steps are queued 0.5 s apart
    assert first == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert simulate(trace, VirtualConfig(**cfg)).steps_frame().groupby("sample_id").enqueued_at.min().max() == 0.0


def test_a_sample_starts_its_latency_after_its_admission() -> None:
    trace = generate("swe_like", 4, seed=3)
    cfg = dict(workers=1, profile="llama3-8b-h100", max_active=2, env_slots=4, inference="recorded", priors={},
               admission_control="static")  # fmt: skip
    r = simulate(trace, VirtualConfig(**cfg, sample_start_latency_s=0.75, sample_start_s=0.5))
    first = r.steps_frame().groupby("sample_id").enqueued_at.min()
    admitted = r.samples_frame().set_index("index").admitted_at
    # the two admitted at 0 start 0.75 s later, one after another; each admitted later (when one
    # finishes) starts 0.75 + 0.5 s after its admission, the others having started long before
    assert first.sort_values().tolist()[:2] == pytest.approx([1.25, 1.75])
    late = admitted[admitted > 0].index
    assert len(late) == 2
    assert (first[late] - admitted[late]).tolist() == pytest.approx([1.25, 1.25])
