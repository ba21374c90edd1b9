"""Re-planning while the batch runs, in virtual time (sim/replan.py): a fork continues exactly where
the batch stands, the futures it simulates come from the ensemble member and never from the batch,
every candidate can be swapped in mid-run safely, and the re-planner switches when a candidate is
predicted faster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES, Candidate
from agentbatch.sim.portfolio import KnownRun, Member, candidate_config
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.replan import (
    Replanner,
    ReplanSettings,
    Snapshot,
    apply,
    future,
    member_futures,
    swap_key,
    swap_state,
)
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.simulation import Checkpoints, context_priors
from agentbatch.traces import chain_priors, generate

BY_NAME = {c.name: c for c in BUILTIN_CANDIDATES}


def _case(family: str = "widesearch_like", n: int = 10, slots: int = 3, workers: int = 2):
    trace = generate(family, n, seed=2, epoch=1)
    earlier = generate(family, n, seed=2, epoch=0)
    base = VirtualConfig(workers=workers, profile=get_profile("llama3-8b-h100"), env_slots=slots)
    return trace, base, Member(earlier, chain_priors(earlier), context_priors(earlier))


def _config(c: Candidate, base: VirtualConfig, member: Member, n: int) -> VirtualConfig:
    return candidate_config(c, base, samples=n, n_ref=max(2, n // 2), priors=member.priors,
                            context_priors=member.context_priors)  # fmt: skip


@pytest.mark.parametrize("name", ["coupled at S*0.5", "defaults", "decoupled FIFO, all admitted"])
def test_a_fork_with_the_batch_own_futures_continues_it_exactly(name):
    trace, base, member = _case()
    cfg = _config(BY_NAME[name], base, member, len(trace.samples))
    whole = VirtualBatch(trace, cfg).run().makespan_s
    forks: list[float] = []

    def fork_and_finish(batch: VirtualBatch, now: float) -> None:
        futures = {i: t for i, (t, _, _) in batch.positions().items()}  # the realisation itself
        forks.append(Snapshot.of(batch, now).fork(futures).resume().makespan_s)

    batch = VirtualBatch(trace, cfg)
    batch.checkpoints = Checkpoints(whole / 5, fork_and_finish)
    assert batch.run().makespan_s == whole  # checkpoints that change nothing change nothing
    assert len(forks) >= 4 and all(f == whole for f in forks)


def test_futures_keep_the_past_and_never_read_the_unrevealed_realisation():
    trace, _, member = _case()
    real = trace.samples[0]
    mine = member.trace.samples[0]
    pos = 3
    out = future(real, pos, mine, member.trace.samples)
    assert out.steps[:pos] == real.steps[:pos]
    assert out.steps[pos].kind == real.steps[pos].kind and out.steps[pos].prompt_tokens == real.steps[pos].prompt_tokens
    assert out.steps[pos].duration_s == mine.steps[pos].duration_s
    assert [s.index for s in out.steps] == list(range(len(out.steps)))
    # change everything not yet revealed in the batch: the futures do not move
    hidden = replace(real, steps=[*real.steps[:pos], replace(real.steps[pos], duration_s=999.0, output_tokens=7),
                                  *[replace(s, duration_s=123.0) for s in real.steps[pos + 1:]]])  # fmt: skip
    assert future(hidden, pos, mine, member.trace.samples).steps[pos:] == out.steps[pos:]
    # not yet admitted: nothing of the batch's chain is revealed
    assert [s.duration_s for s in future(real, None, mine, member.trace.samples).steps] == [
        s.duration_s for s in mine.steps]


def test_a_sample_past_its_member_chain_goes_on_as_the_members_that_are_still_running():
    _, _, member = _case()
    samples = member.trace.samples
    short = min(samples, key=lambda s: len(s.steps))
    longest = max(samples, key=lambda s: len(s.steps))
    pos = len(short.steps) + 1
    real = replace(short, steps=[replace(longest.steps[k], index=k) for k in range(pos + 1)])
    out = future(real, pos, short, samples)
    assert len(out.steps) > pos + 1 or out.steps[-1].done  # a conditional tail, or ends where it is
    past_all = replace(short, steps=[replace(longest.steps[k % len(longest.steps)], index=k)
                                     for k in range(len(longest.steps) + 3)])  # fmt: skip
    last = len(past_all.steps) - 1
    ended = future(past_all, last, short, samples)
    assert len(ended.steps) == last + 1  # no member runs that long: it ends with the step it is at


def test_member_futures_come_from_the_same_task_in_the_member():
    trace, base, member = _case()
    cfg = _config(BY_NAME["defaults"], base, member, len(trace.samples))
    seen = {}

    def look(batch: VirtualBatch, now: float) -> None:
        seen.update(member_futures(batch, member))

    batch = VirtualBatch(trace, cfg)
    batch.checkpoints = Checkpoints(30.0, look)
    batch.run()
    assert seen
    by_task = {s.task_id: s for s in member.trace.samples}
    for i, fut in seen.items():
        assert fut.task_id == trace.samples[i].task_id
        tail = [s.duration_s for s in fut.steps[-2:]]
        assert tail == [s.duration_s for s in by_task[fut.task_id].steps[-2:]] or fut.steps[-1].done


@pytest.mark.parametrize("start", ["coupled at S*0.5", "defaults"])
def test_every_candidate_can_be_swapped_in_mid_run_and_the_batch_ends_whole(start):
    trace, base, member = _case(slots=2)
    n = len(trace.samples)
    cfg = _config(BY_NAME[start], base, member, n)
    whole = VirtualBatch(trace, cfg).run()
    pool = [c for c in BUILTIN_CANDIDATES if c.name != start]

    def swap_next(batch: VirtualBatch, now: float) -> None:
        apply(batch, pool[len(swapped) % len(pool)], now, member, max(2, n // 2))
        swapped.append(now)

    swapped: list[float] = []
    batch = VirtualBatch(trace, cfg)
    batch.checkpoints = Checkpoints(whole.makespan_s / 12, swap_next)
    raw = batch.run()
    assert len(swapped) >= 6
    assert [r[2] for r in raw.samples] == [r[2] for r in whole.samples]  # every step of every sample ran
    assert [r[3] for r in raw.samples] == [r[3] for r in whole.samples]  # the same scores
    assert batch.core.peaks()["environment"] <= base.env_slots
    assert batch.core.in_use() == {p.name: 0 for p in batch.core.pools()}  # every slot came back


def test_a_coupled_candidate_runs_as_its_decoupled_equivalent():
    trace, base, member = _case(slots=3)
    for name in ("coupled at S*0.5", "coupled at S*1", "coupled at slots (paper)"):
        c = BY_NAME[name]
        cfg = _config(c, base, member, len(trace.samples))
        twin = replace(cfg, coupled=False, max_active=min(cfg.max_active, cfg.env_slots))
        assert VirtualBatch(trace, cfg).run().makespan_s == VirtualBatch(trace, twin).run().makespan_s


@pytest.mark.parametrize(("start", "workers"), [("coupled at S*1", 1), ("defaults", 1), ("defaults", 2),
                                               ("decoupled FIFO, all admitted", 2)])
def test_candidates_that_share_a_swap_key_run_the_rest_alike(start, workers):
    # what the re-planner simulates once for all of them: one worker makes the router no part of it,
    # engines launched "fcfs" the priority policy, an arrival order the priors; two sequences per
    # engine make requests wait there, where a priority policy would order them
    trace, base, member = _case(slots=3, workers=workers)
    base = replace(base, profile_overrides={"max_num_seqs": 2})
    n, n_ref = len(trace.samples), max(2, len(trace.samples) // 2)
    cfg = _config(BY_NAME[start], base, member, n)
    whole = VirtualBatch(trace, cfg).run().makespan_s
    shared: list[int] = []

    def swap_each(batch: VirtualBatch, now: float) -> None:
        snap, futures, state = Snapshot.of(batch, now), member_futures(batch, member), swap_state(batch)
        groups: dict[tuple[object, ...], list[Candidate]] = {}
        for c in BUILTIN_CANDIDATES:
            groups.setdefault(swap_key(c, batch, member, n_ref, state), []).append(c)
        for group in groups.values():
            ends = set()
            for c in group:
                fork = snap.fork(futures)
                apply(fork, c, now, member, n_ref)
                ends.add(fork.resume().makespan_s)
            assert len(ends) == 1, [c.name for c in group]
        shared.append(len(BUILTIN_CANDIDATES) - len(groups))

    batch = VirtualBatch(trace, cfg)
    batch.checkpoints = Checkpoints(whole / 4, swap_each)
    batch.run()
    assert len(shared) >= 3 and all(k > 0 for k in shared)  # candidates did share a key at every checkpoint


def test_the_replanner_switches_to_a_candidate_predicted_faster_and_the_batch_gains():
    trace, base, member = _case(slots=4)
    n = len(trace.samples)
    slow = BY_NAME["coupled at S*0.25"]  # one sample at a time: far behind the others
    cfg = _config(slow, base, member, n)
    static = VirtualBatch(trace, cfg).run().makespan_s
    rp = Replanner([member], list(BUILTIN_CANDIDATES), slow, max(2, n // 2), ReplanSettings(every=0.1, margin=0.02))
    batch = VirtualBatch(trace, cfg)
    rp.attach(batch, static)
    replanned = batch.run().makespan_s
    assert rp.switches and rp.switches[0].old == slow.name
    sw = rp.switches[0]
    assert all(t <= s for t, s in zip(sw.new_predicted, sw.old_predicted, strict=True))
    assert replanned < 0.9 * static
    assert rp.simulations > 0 and rp.cpu_s > 0 and rp.checkpoints >= 1


@pytest.mark.parametrize(("slots", "workers"), [(4, 2), (10, 1)])
def test_remainders_that_run_alike_are_simulated_once_and_change_nothing(monkeypatch, slots, workers):
    # a candidate whose remainder another one's answers (portfolio.KnownRun: they differ only in
    # policies that decided nothing there) is predicted as its own simulation would be: the same
    # checkpoints, predictions, switches and makespan as with every remainder simulated
    trace, base, member = _case(slots=slots, workers=workers)
    n = len(trace.samples)
    slow = BY_NAME["coupled at S*0.25"]
    cfg = _config(slow, base, member, n)
    static = VirtualBatch(trace, cfg).run().makespan_s

    def replanned() -> tuple[Replanner, float]:
        rp = Replanner([member], list(BUILTIN_CANDIDATES), slow, max(2, n // 2), ReplanSettings(every=0.1))
        batch = VirtualBatch(trace, cfg)
        rp.attach(batch, static)
        return rp, batch.run().makespan_s

    reused, makespan = replanned()
    monkeypatch.setattr(KnownRun, "answers", lambda self, parts, stop: None)
    every, makespan_every = replanned()
    assert reused.simulations < every.simulations
    assert (reused.history, reused.switches, makespan) == (every.history, every.switches, makespan_every)


def test_no_switch_without_a_predicted_gain():
    trace, base, member = _case(slots=4)
    n = len(trace.samples)
    c = BY_NAME["decoupled FIFO, all admitted"]
    cfg = _config(c, base, member, n)
    static = VirtualBatch(trace, cfg).run().makespan_s
    rp = Replanner([member], [c, BY_NAME["coupled at S*0.25"]], c, max(2, n // 2), ReplanSettings(every=0.2))
    batch = VirtualBatch(trace, cfg)
    rp.attach(batch, static)
    assert batch.run().makespan_s == static and not rp.switches


def test_settings_are_checked():
    with pytest.raises(ValueError):
        ReplanSettings(every=0)
    with pytest.raises(ValueError):
        ReplanSettings(margin=1.0)


def test_without_history_futures_come_from_the_sample_at_the_same_position_and_the_batch_ends_whole():
    trace, base, _ = _case(slots=3)
    n = len(trace.samples)
    members = [Member(generate("widesearch_like", n, seed=s, epoch=0)) for s in (21, 22)]
    c = BY_NAME["decoupled FIFO, all admitted"]
    cfg = candidate_config(c, base, samples=n, n_ref=max(2, n // 2))
    static = VirtualBatch(trace, cfg).run()
    rp = Replanner(members, list(BUILTIN_CANDIDATES), c, max(2, n // 2), ReplanSettings(every=0.25))
    batch = VirtualBatch(trace, cfg)
    rp.attach(batch, static.makespan_s)
    raw = batch.run()
    assert rp.checkpoints >= 3 and len(rp.history) == rp.checkpoints
    assert [r[2] for r in raw.samples] == [r[2] for r in static.samples]
    seen = member_futures(VirtualBatch(trace, cfg), members[0])  # before admission: all of the member's chain
    assert {i: len(f.steps) for i, f in seen.items()} == {i: len(members[0].trace.samples[i].steps) for i in range(n)}
