"""Re-planning a live batch (sim/replan_live.py): the past replayed from what the batch recorded
reaches the state the batch was in, so a look at a checkpoint decides what virtual time decided."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.portfolio import Member, candidate_config
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.replan import Replanner, ReplanSettings, Revealed
from agentbatch.sim.replan_live import LivePlan, look, replay_trace
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import chain_priors, generate
from agentbatch.traces.schema import Trace

BY_NAME = {c.name: c for c in BUILTIN_CANDIDATES}


def _recorded(trace: Trace, share: float) -> tuple[Trace, Revealed]:
    """The batch as a store would show it mid-run: each sample's first steps, none ended."""
    samples, steps = [], {}
    for i, s in enumerate(trace.samples):
        n = int(len(s.steps) * share)
        samples.append(replace(s, steps=s.steps[:n]))
        steps[i] = n
    return replace(trace, samples=samples), Revealed(steps, frozenset())


@pytest.mark.parametrize(("share", "slots"), [(0.0, 4), (0.5, 4), (0.3, 6)])
def test_a_look_from_the_record_decides_what_virtual_time_decided(share, slots):
    # The ensemble is the batch itself: its futures are the truth, so the replayed past is the
    # batch's own and every look must match the in-simulation re-planner at the same checkpoint,
    # whatever part of the chains the store had recorded.
    trace = generate("widesearch_like", 10, seed=2, epoch=1)
    earlier = generate("widesearch_like", 10, seed=2, epoch=0)
    member = Member(trace, chain_priors(earlier), context_priors(earlier))
    base = VirtualConfig(workers=2, profile=get_profile("llama3-8b-h100"), env_slots=slots)
    n, n_ref = len(trace.samples), 5
    slow = BY_NAME["coupled at S*0.25"]
    cfg = candidate_config(slow, base, samples=n, n_ref=n_ref, priors=member.priors,
                           context_priors=member.context_priors)  # fmt: skip
    static = VirtualBatch(trace, cfg).run().makespan_s
    settings = ReplanSettings(every=0.1, margin=0.02)
    rp = Replanner([member], list(BUILTIN_CANDIDATES), slow, n_ref, settings)
    batch = VirtualBatch(trace, cfg)
    rp.attach(batch, static)
    batch.run()
    assert rp.switches, "the case must switch at least once"
    plan = LivePlan([member], list(BUILTIN_CANDIDATES), slow, base, n_ref, 0.1 * static, settings)
    recorded, revealed = _recorded(trace, share)
    for k, looked in enumerate(rp.history, start=1):
        earlier_switches = [sw for sw in rp.switches if sw.at_s < looked.at_s]
        seen = look(plan, recorded, revealed, k, earlier_switches)
        assert seen.reached
        want = next((sw for sw in rp.switches if sw.at_s == looked.at_s), None)
        if want is None:
            assert seen.switch is None, k
        else:
            assert seen.switch == want, k


def test_the_replay_keeps_what_was_recorded_and_continues_from_the_member():
    trace = generate("swe_like", 6, seed=1, epoch=1)
    member = Member(generate("swe_like", 6, seed=1, epoch=0))
    recorded, revealed = _recorded(trace, 0.5)
    ended = replace(revealed, ended=frozenset({0}))
    replay = replay_trace(recorded, ended, member)
    mine = {s.task_id: s for s in member.trace.samples}
    assert [s.index for s in replay.samples] == list(range(len(trace.samples)))
    assert replay.samples[0].steps == recorded.samples[0].steps  # ended live: its chain as recorded
    for i in range(1, len(trace.samples)):
        s, known = replay.samples[i], revealed.steps[i]
        assert [st.duration_s for st in s.steps[:known]] == [st.duration_s for st in trace.samples[i].steps[:known]]
        theirs = mine[s.task_id].steps[known:]
        if known == 0 or (theirs and theirs[0].kind != s.steps[known - 1].kind):  # the member goes on from here
            assert [st.duration_s for st in s.steps[known:]] == [st.duration_s for st in theirs]
        assert [st.index for st in s.steps] == list(range(len(s.steps)))


def test_a_checkpoint_after_the_replayed_end_is_not_reached():
    trace = generate("bfcl_like", 4, seed=1, epoch=1)
    member = Member(trace)
    base = VirtualConfig(workers=1, profile=get_profile("llama3-8b-h100"), env_slots=4)
    c = BY_NAME["decoupled FIFO, all admitted"]
    cfg = candidate_config(c, base, samples=4, n_ref=4)
    makespan = VirtualBatch(trace, cfg).run().makespan_s
    plan = LivePlan([member], list(BUILTIN_CANDIDATES), c, base, 4, makespan / 2, ReplanSettings())
    recorded, revealed = _recorded(trace, 0.0)
    assert look(plan, recorded, revealed, 1, []).reached
    assert not look(plan, recorded, revealed, 3, []).reached
