"""A simulation run with a stop (`VirtualBatch.run(stop_after_s=...)`, how the portfolio cuts a
candidate that cannot win) may stop before its clock reaches the stop, when the environment steps
its unfinished samples still need cannot fit: the cut must never hit a run that would have ended
by the stop, and where it is taken its bound is below the real makespan."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.portfolio import candidate_config
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.simulation import SimulationCut
from agentbatch.traces import generate

CASES = [("swe_like", 12, 2, 1, "engine"), ("widesearch_like", 10, 3, 2, "engine"), ("mcp_like", 14, 4, 1, "engine"),
         ("widesearch_like", 10, 3, 2, "recorded")]
PICK = ("coupled at S*0.5", "decoupled FIFO, all admitted", "defaults")


@pytest.mark.parametrize(("family", "n", "slots", "workers", "inference"), CASES)
def test_a_cut_never_hits_a_run_that_ends_by_its_stop(family, n, slots, workers, inference):
    trace = generate(family, n, seed=3, epoch=0)
    base = VirtualConfig(workers=workers, profile=get_profile("llama3-8b-h100"), env_slots=slots, inference=inference)
    for c in (c for c in BUILTIN_CANDIDATES if c.name in PICK):
        cfg = candidate_config(c, base, samples=n, n_ref=max(2, n // 2))
        makespan = VirtualBatch(trace, cfg).run().makespan_s
        assert VirtualBatch(trace, cfg).run(stop_after_s=makespan).makespan_s == makespan
        for share in (0.3, 0.7, 0.99):
            with pytest.raises(SimulationCut) as cut:
                VirtualBatch(trace, cfg).run(stop_after_s=share * makespan)
            assert share * makespan < cut.value.at_s <= makespan


def test_the_tail_bound_cuts_before_the_clock_reaches_the_stop():
    # one long chain of environment steps: its remaining tool time alone passes the stop early
    trace = generate("swe_like", 6, seed=1, epoch=0)
    base = VirtualConfig(workers=1, profile=get_profile("llama3-8b-h100"), env_slots=6)
    cfg = candidate_config(BUILTIN_CANDIDATES[3], base, samples=6, n_ref=6)
    makespan = VirtualBatch(trace, cfg).run().makespan_s
    batch = VirtualBatch(trace, cfg)
    with pytest.raises(SimulationCut) as cut:
        batch.run(stop_after_s=0.9 * makespan)
    assert 0.9 * makespan < cut.value.at_s <= makespan
    assert max((r[5] for r in batch._steps), default=0.0) < 0.5 * makespan  # cut long before the stop
