"""Re-planning a batch that runs on the wall clock: its past replayed in virtual time.

A live batch cannot be forked like a simulation (sim/replan.py). At its k-th checkpoint its past is
replayed instead: every sample's steps the store has recorded (their durations and token counts:
what the batch has revealed), continued by the first ensemble member's run of the same task, run in
virtual time under the policies the batch ran (the choice before it, and each earlier switch at its
checkpoint) up to the k-th checkpoint. There the Replanner looks as it does in virtual time, with
one difference: a sample's recorded steps stay as recorded even where the replay has not reached
them, and a sample that ended live keeps its whole chain. The state it starts from is therefore the
replay's (who is admitted, the engines' caches, what is queued), which follows the live run as far
as virtual time predicts it (docs/ablation.md, "policy auto, live").
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context

from agentbatch.scheduling.portfolio import Candidate
from agentbatch.sim.portfolio import Member, candidate_config
from agentbatch.sim.replan import (
    Replanner,
    ReplanSettings,
    Revealed,
    Switch,
    apply,
    by_task,
    continued,
    member_sample,
)
from agentbatch.sim.virtual_time.simulation import Checkpoints, VirtualBatch, VirtualConfig
from agentbatch.traces.schema import Trace, TraceSample


@dataclass(frozen=True)
class LivePlan:
    """What a live batch re-plans with: the ensemble and the candidates the choice simulated, the one
    it chose, the virtual-time config of the engines and slots, N_ref, and the checkpoint interval in
    virtual seconds."""

    members: Sequence[Member]
    pool: Sequence[Candidate]
    first: Candidate
    base: VirtualConfig
    n_ref: int
    every_s: float
    settings: ReplanSettings
    # A gateway batch's samples arrive as the harness sends them (`base.harness`): the samples it
    # expects in all; those not yet arrived are the first member's at their positions.
    expected: int | None = None


@dataclass(frozen=True)
class Look:
    """One live checkpoint: the switch (None: stay), the simulations it took and their CPU seconds;
    `reached` is False when the replayed past ended before the checkpoint (nothing to plan)."""

    switch: Switch | None
    simulations: int
    cpu_s: float
    reached: bool = True


class _Reached(Exception):
    """Ends the replay once the checkpoint has been looked at."""


def replay_trace(recorded: Trace, revealed: Revealed, member: Member, expected: int | None = None) -> Trace:
    """The batch's samples (trace index = position) with their recorded steps, each unfinished one
    continued by the member's run of its task from where it stands (all of it when nothing is
    recorded). `expected`: the samples a gateway batch expects; those beyond the recorded ones have
    not arrived yet, and are the member's at their positions (what the harness will send)."""
    own = by_task(member.trace.samples)
    out: list[TraceSample] = []
    for i, s in enumerate(recorded.samples):
        mine = member_sample(member, own, s.task_id, i)
        known = revealed.steps.get(i, 0)
        if i in revealed.ended:
            steps = s.steps[:known]
        elif known == 0:
            steps = list(mine.steps)
        else:
            steps = continued(s, known, mine, member.trace.samples).steps
        out.append(replace(s, index=i, steps=[replace(st, index=k) for k, st in enumerate(steps)]))
    for i in range(len(out), expected or 0):
        out.append(replace(member.trace.samples[i % len(member.trace.samples)], index=i))
    return replace(recorded, samples=out)


def look(plan: LivePlan, recorded: Trace, revealed: Revealed, k: int, switches: Sequence[Switch]) -> Look:
    """The k-th checkpoint (k >= 1) of a live batch whose recorded steps are `recorded` (module
    docstring); `switches`: those made at earlier checkpoints, in order."""
    member = plan.members[0]
    trace = replay_trace(recorded, revealed, member, plan.expected)
    incumbent = plan.first
    names = {c.name: c for c in plan.pool}
    cfg = candidate_config(incumbent, plan.base, samples=len(trace.samples), n_ref=plan.n_ref,
                           priors=member.priors, context_priors=member.context_priors)  # fmt: skip
    batch = VirtualBatch(trace, cfg)
    past = {round(sw.at_s / plan.every_s): sw.new for sw in switches}
    for sw in switches:
        incumbent = names[sw.new]
    planner = Replanner(plan.members, plan.pool, incumbent, plan.n_ref, plan.settings, revealed=revealed)
    seen = [0]

    def checkpoint(b: VirtualBatch, now: float) -> None:
        seen[0] += 1
        if seen[0] < k:
            if seen[0] in past:
                apply(b, names[past[seen[0]]], now, member, plan.n_ref)
            return
        planner(b, now)
        raise _Reached

    batch.checkpoints = Checkpoints(plan.every_s, checkpoint)
    try:
        batch.run()
    except _Reached:
        return Look(planner.switches[-1] if planner.switches else None, planner.simulations, planner.cpu_s)
    return Look(None, planner.simulations, planner.cpu_s, reached=False)


class LookProcess:
    """Looks in a process of its own, spawned once with the plan: a look's simulations then take
    neither the live runner's interpreter lock nor its event loop's time."""

    def __init__(self, plan: LivePlan) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_hold, initargs=(plan,))
        self._pool.submit(int)  # start it now: its imports take a second or two

    def look(self, recorded: Trace, revealed: Revealed, k: int, switches: Sequence[Switch]) -> Look:
        """`look` with the plan held there (blocking: call it from a thread)."""
        return self._pool.submit(_look_held, recorded, revealed, k, list(switches)).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_HELD: list[LivePlan] = []  # in the look process: the plan it was spawned with


def _hold(plan: LivePlan) -> None:
    _HELD[:] = [plan]


def _look_held(recorded: Trace, revealed: Revealed, k: int, switches: list[Switch]) -> Look:
    return look(_HELD[0], recorded, revealed, k, switches)
