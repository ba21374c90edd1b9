"""The makespan lower bound is a lower bound: over hundreds of random small traces, engine profiles
(small token budgets, prefill-chunk thresholds, few sequences, tiny KV caches), capacities and every
policy, no simulated schedule finishes before it. The same cases with the inference term doubled
must break it somewhere: the property has the power to catch an over-estimate."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache

import pytest

from agentbatch.scheduling.lower_bound import LowerBound
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.sim.virtual_time.bounds import trace_lower_bound
from agentbatch.traces import FAMILIES, generate
from agentbatch.traces.schema import Trace

CASES = 520
PARTS = 8  # the cases split into this many tests
POLICIES = {
    "baseline": dict(coupled=True, router=PolicySpec("round_robin"), env_queue=PolicySpec("fifo"),
                     inference_queue=PolicySpec("fifo"), priority=PolicySpec("fcfs"), admission_order="arrival"),
    "decoupled_fifo": dict(router=PolicySpec("trajectory_aware"), env_queue=PolicySpec("fifo"),
                           priority=PolicySpec("fcfs")),
    "coordinated": {},  # the defaults
    "least_loaded_caas": dict(router=PolicySpec("least_loaded"), inference_queue=PolicySpec("caas")),
}


@dataclass
class Case:
    trace: Trace
    config: VirtualConfig


def _case(rng: random.Random) -> Case:
    family = rng.choice(sorted(FAMILIES))
    trace = generate(family, rng.randint(1, 10), seed=rng.randrange(10**6))
    for s in trace.samples:  # shorter chains keep the cases small
        cut = min(len(s.steps), 2 * rng.randint(1, 6))
        s.steps = s.steps[:cut]
    profile = rng.choice(["llama3-8b-h100", "ling-flash-2.0-h200", "tiny-cpu"])
    base = get_profile(profile)
    overrides = {
        "max_num_seqs": rng.choice([1, 2, 4, 8, base.max_num_seqs]),
        "max_num_batched_tokens": rng.choice([256, 512, 2048, base.max_num_batched_tokens]),
        "long_prefill_token_threshold": rng.choice([0, 0, 16, 64, 128, 1024]),
        "num_kv_blocks": rng.choice([base.num_kv_blocks, max(64, base.num_kv_blocks // 200),
                                     max(128, base.num_kv_blocks // 50)]),
    }
    config = VirtualConfig(workers=rng.randint(1, 3), profile=profile, profile_overrides=overrides,
                           env_slots=rng.randint(1, 4), max_active=rng.randint(1, 6),
                           per_worker_inflight=rng.choice([None, 1, 2, 8]),
                           env_time_scale=rng.choice([0.001, 0.01, 0.1, 1.0]))  # fmt: skip
    if rng.random() < 0.25:  # engine-bound: many samples at once on one worker, tools nearly free
        trace = generate(family, rng.randint(10, 16), seed=rng.randrange(10**6))
        for s in trace.samples:
            s.steps = s.steps[:8]
        config = replace(config, workers=1, max_active=len(trace.samples), env_slots=len(trace.samples),
                         per_worker_inflight=None, env_time_scale=0.001)  # fmt: skip
    return Case(trace, config)


def _fits(trace: Trace, profile_kv_tokens: int) -> bool:
    # A prompt larger than the whole KV cache cannot run on this engine at all: not a valid case.
    longest = max((st.prompt_tokens or 0) + (st.output_tokens or 0) for s in trace.samples for st in s.steps)
    return longest < profile_kv_tokens


@cache
def _cases() -> list[tuple[int, Case, LowerBound]]:
    """The CASES valid cases with their bounds, the same list on every call (one seed; built once
    per test process, which runs several parts)."""
    rng = random.Random(20251203)
    cases: list[tuple[int, Case, LowerBound]] = []
    while len(cases) < CASES:
        case = _case(rng)
        profile = case.config.engine_profile()
        if not _fits(case.trace, profile.kv_capacity_tokens):
            continue
        lb = trace_lower_bound(case.trace, profile, case.config.workers, case.config.env_slots,
                               case.config.env_time_scale)  # fmt: skip
        cases.append((len(cases), case, lb))
    return cases


def _makespans(case: Case) -> Iterator[tuple[str, float]]:
    for name, fields in POLICIES.items():
        yield name, simulate(case.trace, replace(case.config, **fields)).summary.makespan_s


@pytest.mark.parametrize("part", range(PARTS))
def test_makespan_is_never_below_the_lower_bound(part: int) -> None:
    """Every PARTS-th case from `part` on: the parts run on parallel test workers, together all cases."""
    for i, case, lb in _cases():
        if i % PARTS != part:
            continue
        for name, makespan in _makespans(case):
            assert makespan >= lb.value * (1 - 1e-9), (
                f"case {i} policy {name}: makespan {makespan} < LB {lb} "
                f"({case.config.profile} {case.config.profile_overrides}, workers {case.config.workers})"
            )


def test_a_doubled_inference_term_is_broken() -> None:
    """With the inference term doubled the "bound" exceeds some achieved makespan among the same
    cases: the property above has the power to catch an over-estimate."""
    for _, case, lb in _cases():
        doubled = LowerBound(lb.longest_chain_s, 2 * lb.inference_bound_s, lb.environment_bound_s)
        if any(makespan < doubled.value for _, makespan in _makespans(case)):
            return
    pytest.fail(f"no case of {CASES} finished below the doubled bound")
