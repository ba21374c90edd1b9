"""Decode-only spans (EngineModel.plan_decodes / commit_decodes): virtual time runs stretches of
iterations that only decode without an event each. The results must be those of the event-per-
iteration schedule, bit for bit: every step row, sample row, engine counter and admission decision."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.model import EngineModel
from agentbatch.sim.portfolio import candidate_config
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import chain_priors, generate


class _OneEventPerIteration:
    """The engine model without plan_decodes: the driver then gives every iteration its events."""

    def __init__(self, profile, name, policy):
        self._m = EngineModel(profile, name=name, policy=policy)

    def __getattr__(self, attr):
        if attr == "plan_decodes":
            raise AttributeError(attr)
        return getattr(self._m, attr)


def _slow(profile, name, policy):
    return _OneEventPerIteration(profile, name, policy)


CASES = [  # family, profile overrides, workers, slots, candidate
    ("widesearch_like", "ling-flash-2.0-h200", {"num_kv_blocks": 2000, "state_slots": 4, "state_checkpoints": 2}, 4,
     8, "decoupled FIFO, all admitted"),
    ("widesearch_like", "ling-flash-2.0-h200", {"num_kv_blocks": 2000, "state_slots": 4, "state_checkpoints": 2}, 2,
     4, "defaults"),
    ("swe_like", "llama3-8b-h100", {"num_kv_blocks": 13000, "max_num_seqs": 8}, 2, 4, "defaults, kv_balanced order"),
    ("mcp_like", "llama3-8b-h100", {}, 1, 2, "coupled at S*0.5"),
    ("bfcl_like", "llama3-8b-h100", {"max_num_seqs": 4}, 3, 8, "CAAS, all admitted"),
]


@pytest.mark.parametrize(("family", "profile", "overrides", "workers", "slots", "name"), CASES)
def test_spans_change_nothing_but_the_event_count(family, profile, overrides, workers, slots, name):
    trace = generate(family, 12, seed=5, epoch=1)
    earlier = generate(family, 12, seed=5, epoch=0)
    cand = next(c for c in BUILTIN_CANDIDATES if c.name == name)
    base = VirtualConfig(workers=workers, profile=profile, profile_overrides=overrides, env_slots=slots)
    cfg = candidate_config(cand, base, samples=12, n_ref=6, priors=chain_priors(earlier),
                           context_priors=context_priors(earlier))
    fast = VirtualBatch(trace, cfg).run()
    slow = VirtualBatch(trace, cfg, engine_factory=_slow).run()
    assert fast.events < slow.events  # spans did run
    assert fast.makespan_s == slow.makespan_s
    assert fast.steps == slow.steps and fast.samples == slow.samples
    assert fast.engine_metrics == slow.engine_metrics
    assert fast.admission_limits == slow.admission_limits
