"""VirtualBatch.decided(): the policies that chose something in a run. A run with another policy in a
part it does not name, all else the same, must be the same run event for event (choosing by
simulation, sim/portfolio.py, takes such a run's result instead of simulating it again)."""

from __future__ import annotations

import pytest

from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig
from agentbatch.sim.virtual_time.simulation import VirtualBatch
from agentbatch.traces import chain_priors, generate

PROFILE = "llama3-8b-h100"


def _run(trace, **kw):
    batch = VirtualBatch(trace, VirtualConfig(workers=1, profile=PROFILE, **kw))
    return batch, batch.run()


@pytest.mark.parametrize("family", ["mcp_like", "swe_like"])
def test_environment_queues_that_never_held_two_steps_run_alike(family):
    trace = generate(family, 12, seed=2, epoch=0)
    pri = chain_priors(trace)
    batch, fifo = _run(trace, env_slots=12, max_active=12, env_queue=PolicySpec("fifo"), priors=pri)
    assert "env_queue" not in batch.decided()
    _, caas = _run(trace, env_slots=12, max_active=12, env_queue=PolicySpec("caas_history", {"rank": "progress"}),
                   priors=pri)
    assert (caas.steps, caas.samples, caas.makespan_s) == (fifo.steps, fifo.samples, fifo.makespan_s)


def test_an_environment_queue_that_held_two_steps_has_decided():
    trace = generate("mcp_like", 12, seed=2, epoch=0)
    batch, fifo = _run(trace, env_slots=2, max_active=12, env_queue=PolicySpec("fifo"))
    assert "env_queue" in batch.decided()
    # with three samples admitted and two slots at most one step waits: no choice
    few, _ = _run(trace, env_slots=2, max_active=3, env_queue=PolicySpec("fifo"), admission_control="static")
    assert "env_queue" not in few.decided()


@pytest.mark.parametrize(("family", "limit"), [("mcp_like", 6), ("swe_like", 8), ("bfcl_like", 3)])
def test_adaptive_admission_that_never_moved_the_limit_runs_as_the_static_limit(family, limit):
    trace = generate(family, 12, seed=2, epoch=0)
    batch, adaptive = _run(trace, env_slots=16, max_active=limit, admission_control="adaptive")
    _, static = _run(trace, env_slots=16, max_active=limit, admission_control="static")
    moved = any(d.limit != limit for d in batch.core.controller.history)
    assert ("admission_control" in batch.decided()) == moved
    if not moved:
        assert (adaptive.steps, adaptive.makespan_s) == (static.steps, static.makespan_s)
    else:  # the moves are why it differs
        assert adaptive.makespan_s != static.makespan_s


def test_a_cut_run_reports_what_was_decided_before_the_cut():
    trace = generate("mcp_like", 12, seed=2, epoch=0)
    full, result = _run(trace, env_slots=2, max_active=12, env_queue=PolicySpec("fifo"))
    cut = VirtualBatch(trace, VirtualConfig(workers=1, profile=PROFILE, env_slots=2, max_active=12,
                                            env_queue=PolicySpec("fifo")))
    with pytest.raises(Exception, match="stopped at"):
        cut.run(stop_after_s=result.makespan_s / 50)
    assert cut.decided() <= full.decided()
