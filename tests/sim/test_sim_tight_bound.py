"""The tight lower bound (window bounds beside LB) is never above an achieved makespan, for any
policy of the portfolio on any small batch and hardware drawn; and the window bound's arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentbatch.scheduling.lower_bound import window_bound
from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.portfolio import candidate_config
from agentbatch.sim.virtual_time import VirtualConfig, simulate
from agentbatch.sim.virtual_time.bounds import trace_tight_bound
from agentbatch.traces import FAMILIES, chain_priors, generate


def test_window_bound_charges_heads_and_tails():
    # two samples, one slot: neither can use it before 2 s nor in its last 1 s
    assert window_bound([2.0, 3.0], [4.0, 4.0], [1.0, 2.0], 1) == pytest.approx(2 + 8 + 1)
    # a late-starting sample alone gives more: 10 + 1 + 1
    assert window_bound([0.0, 10.0], [5.0, 1.0], [0.0, 1.0], 1) == pytest.approx(12.0)
    # set-dependent overhead: 1 s for each sample in the set
    assert window_bound([0.0, 0.0], [1.0, 1.0], [0.0, 0.0], 2,
                        overhead=lambda order: 1.0 + __import__("numpy").arange(len(order))) == pytest.approx(2.0)
    assert window_bound([], [], [], 1) == 0.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    n=st.integers(2, 9),
    seed=st.integers(0, 10_000),
    profile=st.sampled_from(["llama3-8b-h100", "ling-flash-2.0-h200"]),
    workers=st.integers(1, 3),
    slots=st.integers(1, 6),
    which=st.integers(0, len(BUILTIN_CANDIDATES) - 1),
    history=st.booleans(),
)
def test_the_tight_bound_is_never_above_an_achieved_makespan(family, n, seed, profile, workers, slots, which,
                                                             history):
    trace = generate(family, n, seed=seed, epoch=1)
    priors = chain_priors(generate(family, n, seed=seed, epoch=0)) if history else None
    base = VirtualConfig(workers=workers, profile=profile, env_slots=slots)
    cfg = candidate_config(BUILTIN_CANDIDATES[which], base, samples=n, n_ref=max(1, n // 2), priors=priors)
    res = simulate(trace, cfg)
    tight = trace_tight_bound(trace, res.config.engine_profile(), workers, slots)
    assert tight.plain.value == pytest.approx(res.summary.lower_bound_s)
    assert tight.plain.value <= tight.value <= res.summary.makespan_s * (1 + 1e-9)
