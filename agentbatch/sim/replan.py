"""Re-planning while the batch runs, in virtual time (issue 24, item 3).

The choice before the batch (`sim/portfolio.py`) sees only priors; a batch that is a tail
realisation (its longest chain shows itself only while it runs) can make it lose. So at checkpoints
(every `ReplanSettings.every` of the chosen candidate's predicted makespan) the running batch is
forked once per ensemble member and per candidate, and each fork simulates the remainder:

- **from the current state**: who is admitted and finished, each sample's steps done, what is
  queued and running, the engines' caches and queues, the slots in use (the fork is a copy of the
  running simulation, so nothing of the past is re-simulated);
- **with unrevealed futures drawn from the member, never from the batch**: a sample's steps not yet
  asked for come from the member's run of the same task (with history) or of the sample at the
  same position (without), from the same step position on; a sample that has already run past the
  member's chain continues as the member's median chain among those still running at that
  position (the member's conditional tail), and ends with the step it is at if none is. A step
  that has been asked for reveals its kind and its prompt (both known once asked), not its
  duration: a running environment action ends at its start plus the member's duration (at the
  earliest now). An inference call already on an engine keeps the length the engine model
  planned for it (one call per sample; a live driver would put an estimate there).

The incumbent's fork runs as it is (no swap: the counterfactual of staying); every other candidate
is swapped in (`apply`, `SchedulingCore.swap`). The rule: switch to a candidate that is predicted no
slower than the incumbent in any member and faster by the margin on average (of those, the fastest
on average); each candidate's run is cut where it can no longer qualify. Why not "faster by the
margin in every member", the rule before the batch: at a checkpoint a member whose outcome is fixed
already (its longest chain has started and nothing can move it) predicts the same makespan for
every candidate, and would veto every switch; "never predicted slower" keeps the guarantee that a
switch cannot be predicted to lose anywhere. Only candidates that would run the rest differently are
simulated (`swap_key`: with no sample waiting for admission the admission limit and order decide
nothing more, with every admitted sample fitting the slots no queue's order matters, with one worker
no router, and engines launched "fcfs" ignore the priority policy), and a candidate whose remainder
on a member runs alike to one simulated there at the same checkpoint takes its result (they differ
only in policies that decided nothing in it: `portfolio.KnownRun`).

The baselines are always candidates, so the fallback stays reachable by construction. A coupled
candidate runs as its decoupled equivalent (admission limit min(limit, slots): each admitted sample
then finds a free slot for every action, as if it held one; tests/sim/test_sim_replan.py checks
that both give the same makespan), because the core cannot enter coupled mode with samples
admitted beyond the slots. The engines keep the scheduling policy they were launched with (fcfs or
priority), as a live vLLM does: a swapped priority policy reaches them as request priorities only.
"""

from __future__ import annotations

import io
import math
import pickle
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentbatch.scheduling.admission_control import AdmissionController
from agentbatch.scheduling.admission_order import AdmissionHints, admission_sequence
from agentbatch.scheduling.core import ADMISSION, PolicySwap
from agentbatch.scheduling.portfolio import Candidate
from agentbatch.scheduling.registry import make_priority, make_queue, make_router
from agentbatch.scheduling.types import SampleProgress
from agentbatch.sim.portfolio import KnownRun, Member, candidate_config
from agentbatch.sim.virtual_time.simulation import Checkpoints, SimulationCut, VirtualBatch, VirtualConfig
from agentbatch.traces.schema import ENVIRONMENT, INFERENCE, TraceSample, TraceStep

# Live runs re-plan only with at least this many ensemble members (earlier runs): with fewer, the
# rule sees too few realisations, and its switches lost more cells to the best baseline than they
# won back (bench/replan_members.py: one run 3 -> 4 cells lost, two 3 -> 4, three 3 -> 2;
# docs/ablation.md, "Re-planning while the batch runs").
MIN_MEMBERS = 3


@dataclass(frozen=True)
class ReplanSettings:
    """every: checkpoint interval as a share of the incumbent's predicted makespan; margin: the mean
    gain over the incumbent the members must predict before the batch switches (none predicting a
    loss)."""

    every: float = 0.1
    margin: float = 0.02

    def __post_init__(self) -> None:
        if not 0 < self.every <= 1 or not 0 <= self.margin < 1:
            raise ValueError(f"every must be in (0, 1] and margin in [0, 1); got {self.every}, {self.margin}")


@dataclass(frozen=True)
class Switch:
    """One switch: when, from which candidate to which, and the remainder's predicted makespans
    (one per member; inf where cut) of both."""

    at_s: float
    old: str
    new: str
    old_predicted: list[float]
    new_predicted: list[float]


@dataclass(frozen=True)
class _Known:
    """A candidate's `swap_parts` on each member and the remainders simulated on each at a checkpoint."""

    parts: list[dict[str, Any]]
    runs: list[list[KnownRun]]

    def on(self, i: int) -> tuple[dict[str, Any], list[KnownRun]]:
        return self.parts[i], self.runs[i]


@dataclass(frozen=True)
class Looked:
    """One checkpoint: the incumbent's predicted makespan per member, how many distinct candidates
    were simulated, and the switch made (None: none qualified) with its mean predicted ratio."""

    at_s: float
    incumbent: str
    stay: list[float]
    candidates: int
    switched_to: str | None
    ratio: float


@dataclass
class Replanner:
    """Re-plans one running VirtualBatch at its checkpoints (module docstring). `attach` it, run the
    batch, then read `switches`, `simulations` and the time spent (`cpu_s`, `wall_s`)."""

    members: Sequence[Member]
    pool: Sequence[Candidate]
    incumbent: Candidate
    n_ref: int
    settings: ReplanSettings = field(default_factory=ReplanSettings)
    switches: list[Switch] = field(default_factory=list)
    checkpoints: int = 0
    simulations: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    history: list[Looked] = field(default_factory=list)
    revealed: Revealed | None = None  # a live batch's record beyond the replayed state (sim/replan_live.py)

    def attach(self, batch: VirtualBatch, predicted_s: float) -> None:
        """Checkpoints every `settings.every` x `predicted_s` of virtual time."""
        if not math.isfinite(predicted_s) or predicted_s <= 0:
            raise ValueError(f"the predicted makespan must be a positive number, got {predicted_s}")
        batch.checkpoints = Checkpoints(self.settings.every * predicted_s, self)

    def __call__(self, batch: VirtualBatch, now: float) -> None:
        start, cpu = time.perf_counter(), time.process_time()
        self.checkpoints += 1
        try:
            self._replan(batch, now)
        finally:
            self.cpu_s += time.process_time() - cpu
            self.wall_s += time.perf_counter() - start

    def _replan(self, batch: VirtualBatch, now: float) -> None:
        snap = Snapshot.of(batch, now)
        futures = [member_futures(batch, m, self.revealed) for m in self.members]
        stay = [self._predict(snap, f, m, None, None) for f, m in zip(futures, self.members, strict=True)]
        best: tuple[float, Candidate, list[float]] | None = None
        distinct = self._distinct(batch)
        state = swap_state(batch)
        known: list[list[KnownRun]] = [[] for _ in self.members]  # the candidates' remainders simulated here
        for c in distinct:
            bound = 1 - self.settings.margin if best is None else min(1 - self.settings.margin, best[0])
            parts = [swap_parts(c, batch, m, self.n_ref, state) for m in self.members]
            preds = self._no_slower(snap, futures, c, stay, bound, _Known(parts, known))
            if preds is not None:
                ratio = statistics.fmean(t / s for t, s in zip(preds, stay, strict=True))
                if ratio <= 1 - self.settings.margin and (best is None or ratio < best[0]):
                    best = (ratio, c, preds)
        self.history.append(Looked(now, self.incumbent.name, stay, len(distinct),
                                   None if best is None else best[1].name, math.nan if best is None else best[0]))
        if best is not None:
            _, c, preds = best
            self.switches.append(Switch(now, self.incumbent.name, c.name, stay, preds))
            apply(batch, c, now, self.members[0], self.n_ref)
            self.incumbent = c

    def _distinct(self, batch: VirtualBatch) -> list[Candidate]:
        """The candidates whose swap would run the rest differently from the incumbent and from each
        other (the first of each kind, in pool order; `swap_key`)."""
        state = swap_state(batch)
        seen = {swap_key(self.incumbent, batch, self.members[0], self.n_ref, state)}
        out = []
        for c in self.pool:
            key = swap_key(c, batch, self.members[0], self.n_ref, state)
            if key not in seen:
                seen.add(key)
                out.append(c)
        return out

    def _no_slower(self, snap: Snapshot, futures: list[dict[int, TraceSample]], c: Candidate,
                   stay: list[float], bound: float, known: _Known) -> list[float] | None:
        """The candidate's remainder in every member, or None once it is predicted slower than the
        incumbent in one, or its mean ratio to the incumbent can no longer reach `bound` (the margin,
        or the best candidate's so far): each run is cut there, and the other members are then not
        simulated. The members with the shortest remainder run first (the cheapest runs; measured
        to simulate less than the members where candidates were cut most often). The cuts are
        exact: the switch made is the one the uncut runs would give, in any order of the members."""
        preds = [math.inf] * len(stay)
        order = sorted(range(len(stay)), key=lambda i: stay[i])
        ratios = 0.0
        for k, i in enumerate(order):
            # the last member must also bring the mean down to the bound
            last = k == len(order) - 1
            stop = stay[i] * (min(1.0, len(stay) * bound - ratios) if last else 1.0)
            preds[i] = self._predict(snap, futures[i], self.members[i], c, stop, known.on(i))
            if preds[i] > stop:
                return None
            ratios += preds[i] / stay[i]
        return preds

    def _predict(self, snap: Snapshot, futures: dict[int, TraceSample], member: Member, c: Candidate | None,
                 stop: float | None, known: tuple[dict[str, Any], list[KnownRun]] | None = None) -> float:
        """The remainder's makespan with `c` swapped in (None: the incumbent stays), inf when cut at
        `stop`; `known`: c's `swap_parts` and the remainders already simulated on this member at this
        checkpoint, one of which answers for c where they run alike (`KnownRun.answers`)."""
        limit = math.inf if stop is None else stop
        if known is not None:
            for run in known[1]:
                answer = run.answers(known[0], limit)
                if answer is not None:
                    return answer[0]
        fork = snap.fork(futures)
        if c is not None:
            apply(fork, c, snap.now, member, self.n_ref)
        self.simulations += 1
        try:
            out = fork.resume(stop_after_s=stop).makespan_s
        except SimulationCut:
            out = math.inf
        if known is not None:
            known[1].append(KnownRun(known[0], fork.decided(), out, 0.0, limit))
        return out


# --- forking a running simulation -----------------------------------------------------------------
class _SharedPickler(pickle.Pickler):
    """Writes the objects in `index` as references to their position (pickle's persistent ids)."""

    def __init__(self, file: io.BytesIO, index: dict[int, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._index = index

    def persistent_id(self, obj: Any, /) -> int | None:
        return self._index.get(id(obj))


class _SharedUnpickler(pickle.Unpickler):
    """Reads those references back as the very objects of `shared`."""

    def __init__(self, file: io.BytesIO, shared: list[Any]) -> None:
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any, /) -> Any:
        return self._shared[pid]


@dataclass(frozen=True)
class Snapshot:
    """A running VirtualBatch pickled at `now`. The traces, the engine profile, the config and the
    checkpoint hook are kept by reference (`shared`: they never change while a batch runs), so a
    copy costs only the state that moves."""

    data: bytes
    shared: list[Any]
    now: float

    @classmethod
    def of(cls, batch: VirtualBatch, now: float) -> Snapshot:
        shared = [batch.trace, *batch.trace.samples, batch.profile, batch.cfg, batch.checkpoints]
        index = {id(o): i for i, o in enumerate(shared)}
        buf = io.BytesIO()
        _SharedPickler(buf, index).dump(batch)
        return cls(buf.getvalue(), shared, now)

    def fork(self, futures: dict[int, TraceSample]) -> VirtualBatch:
        """A copy that never re-plans, with these unrevealed futures."""
        batch = _SharedUnpickler(io.BytesIO(self.data), self.shared).load()
        assert isinstance(batch, VirtualBatch)
        batch.checkpoints = None
        batch.set_futures(futures, self.now)
        return batch


# --- swapping a candidate in ----------------------------------------------------------------------
@dataclass(frozen=True)
class _State:
    waiting: bool  # samples wait for admission
    queues_matter: bool  # a queue can still hold a waiting ticket


def swap_state(batch: VirtualBatch) -> _State:
    """With no sample waiting for admission, no more are admitted; and when the admitted ones fit
    the environment slots and every worker's in-flight limit (each runs one step at a time), no
    queue ever holds a waiting ticket again: its order decides nothing."""
    core = batch.core
    waiting = core.queued()[ADMISSION] > 0
    admitted = core.admission.in_use
    fits = admitted <= core.environment.capacity and all(admitted <= p.capacity for p in core.workers.values())
    return _State(waiting, waiting or not fits or any(core.queued().values()))


def swap_key(c: Candidate, batch: VirtualBatch, member: Member, n_ref: int, state: _State) -> tuple[Any, ...]:
    """`swap_parts` as one key: candidates with one key run the rest alike."""
    return tuple(swap_parts(c, batch, member, n_ref, state).items())


def swap_parts(c: Candidate, batch: VirtualBatch, member: Member, n_ref: int, state: _State) -> dict[str, Any]:
    """What a swap to `c` changes from now on (`swap_state`), each part only where it can decide something:
    the router with more than one worker (with one, every router routes there); the priority policy
    where the engines schedule by priority (engines launched "fcfs" ignore request priorities); the
    queues while one can still hold a waiting ticket; and, while samples wait for admission, the
    admission limit, order and control (with none waiting they decide nothing more: a lower limit
    stops no admitted sample). The priors count where a part that reads them does (the queues, the
    priority, an admission order other than arrival), the context priors only for the "kv_balanced"
    order. Coupled or not is no part of it: a coupled candidate runs as its decoupled equivalent."""
    cfg = candidate_config(c, batch.cfg, samples=len(batch.trace.samples), n_ref=n_ref, priors=member.priors,
                           context_priors=member.context_priors)  # fmt: skip
    priors = cfg.priors is not None
    queues, waiting = state.queues_matter, state.waiting
    order = "arrival" if cfg.admission_order == "trace" else cfg.admission_order
    return {
        "router": cfg.router.name if len(batch.names) > 1 else None,
        "priority": (cfg.priority.name, priors) if batch.engine_policy == "priority" else None,
        "env_queue": (cfg.env_queue.name, tuple(sorted(cfg.env_queue.params.items())), priors) if queues else None,
        "inference_queue": (cfg.inference_queue.name, priors) if queues else None,
        "admission": (switch_target(c, cfg), order, priors and order != "arrival",
                      cfg.context_priors is not None and order == "kv_balanced") if waiting else None,
        "admission_control": cfg.admission_control == "adaptive" and not c.coupled if waiting else None,
    }  # fmt: skip


def switch_target(c: Candidate, cfg: VirtualConfig) -> int:
    """The admission limit a candidate runs with from a switch on: a coupled one as its decoupled
    equivalent, min(limit, slots)."""
    return min(cfg.max_active, cfg.env_slots) if c.coupled else cfg.max_active


def apply(batch: VirtualBatch, c: Candidate, now: float, member: Member, n_ref: int) -> None:
    """Swap candidate `c`'s policies into the running batch (SchedulingCore.swap) at `now`; the
    priors are the member's (the history the batch runs with)."""
    cfg = candidate_config(c, batch.cfg, samples=len(batch.trace.samples), n_ref=n_ref, priors=member.priors,
                           context_priors=member.context_priors)  # fmt: skip
    for s in batch.all_progress():
        s.prior_chain_steps = cfg.priors.get(s.task_id) if cfg.priors else None
    swap = policy_swap(c, cfg, batch.names, coupled_now=batch.core.limits.coupled,
                       kv_tokens=batch.profile.kv_capacity_tokens * cfg.workers)  # fmt: skip
    batch.swapped(swap, now)


def policy_swap(c: Candidate, cfg: VirtualConfig, workers: Sequence[str], *, coupled_now: bool,
                kv_tokens: int) -> PolicySwap:
    """The swap that runs the rest of a batch with candidate `c` (`cfg`: its config from
    `candidate_config`) on these engine workers: a coupled candidate as its decoupled equivalent, the
    waiting samples in its admission order (the samples carry the priors it reads), a fresh adaptive
    controller where it admits adaptively. Both clocks swap with it (the live one in flows/replan.py)."""
    limit = switch_target(c, cfg)
    hints = AdmissionHints(cfg.context_priors, limit, kv_tokens) if cfg.context_priors is not None else None

    def order(waiting: list[SampleProgress]) -> list[SampleProgress]:
        return admission_sequence(waiting, cfg.admission_order, hints)

    adaptive = cfg.admission_control == "adaptive" and not c.coupled
    return PolicySwap(
        coupled=False if coupled_now else None, admission_limit=limit,
        env_queue=make_queue(cfg.env_queue.name, **cfg.env_queue.params),
        inference_queues={w: make_queue(cfg.inference_queue.name, **cfg.inference_queue.params) for w in workers},
        router=make_router(cfg.router.name, **cfg.router.params),
        priority=make_priority(cfg.priority.name, **cfg.priority.params), admission_order=order,
        controller=(AdmissionController(limit) if adaptive else None,),
    )  # fmt: skip


# --- unrevealed futures ---------------------------------------------------------------------------
def member_futures(batch: VirtualBatch, member: Member, revealed: Revealed | None = None) -> dict[int, TraceSample]:
    """Each unfinished sample's trace with what is not yet revealed taken from `member` (module
    docstring): sample index -> its new trace. `revealed`: what a live batch recorded beyond the
    replayed state (sim/replan_live.py) stays as recorded."""
    own = by_task(member.trace.samples)
    out: dict[int, TraceSample] = {}
    for i, (trace, pos, asked) in batch.positions().items():
        if pos >= len(trace.steps) or (revealed is not None and i in revealed.ended):
            continue  # its chain has ended (here or live): nothing is left to reveal
        mine = member_sample(member, own, trace.task_id, i)
        known = revealed.steps.get(i, 0) if revealed is not None else 0
        if known > pos:
            out[i] = continued(trace, known, mine, member.trace.samples)
        else:
            out[i] = future(trace, pos if asked else None, mine, member.trace.samples)
    return out


@dataclass(frozen=True)
class Revealed:
    """What a live batch recorded by a checkpoint: trace index -> steps done, and the samples that
    ended (their whole chain is known)."""

    steps: dict[int, int] = field(default_factory=dict)
    ended: frozenset[int] = frozenset()


def continued(real: TraceSample, known: int, mine: TraceSample, others: Sequence[TraceSample]) -> TraceSample:
    """`real`'s first `known` steps (recorded), then the member's from that position on: `mine` if it
    is still running there with a step of the next kind, else the median chain among `others` that
    is; without one the sample ends with its recorded steps."""
    kind = ENVIRONMENT if real.steps[known - 1].kind == INFERENCE else INFERENCE  # chains alternate
    tail = _tail(mine, known, kind) or _median_tail(others, known, kind)
    rest = [replace(st, index=known + k) for k, st in enumerate(tail)]
    return replace(real, steps=[*real.steps[:known], *rest])


def member_sample(member: Member, own: dict[str, TraceSample], task_id: str, i: int) -> TraceSample:
    """The member's run of the same task (`own`: `by_task` of its samples), else its sample at the
    same position (a member of other tasks)."""
    return own.get(task_id) or member.trace.samples[i % len(member.trace.samples)]


def by_task(samples: Sequence[TraceSample]) -> dict[str, TraceSample]:
    """Each task's first sample."""
    out: dict[str, TraceSample] = {}
    for s in samples:
        out.setdefault(s.task_id, s)
    return out


def future(real: TraceSample, pos: int | None, mine: TraceSample, others: Sequence[TraceSample]) -> TraceSample:
    """`real`'s trace with steps from `pos` on (the step asked for now: its kind and prompt kept)
    taken from the member: `mine` if it is still running at `pos` with a step of that kind, else the
    median chain among `others` that is; without one, the sample ends with the step at `pos`.
    `pos` None: the sample has asked for nothing yet (waiting for admission): all of `mine`."""
    if pos is None:
        return replace(real, steps=[replace(st, index=k) for k, st in enumerate(mine.steps)])
    kind = real.steps[pos].kind
    tail = _tail(mine, pos, kind) or _median_tail(others, pos, kind) or [_last_step(real.steps[pos], mine)]
    asked = real.steps[pos]
    first = replace(tail[0], index=pos, kind=kind, prompt_tokens=asked.prompt_tokens if kind == INFERENCE else None)
    rest = [replace(st, index=pos + 1 + k) for k, st in enumerate(tail[1:])]
    return replace(real, steps=[*real.steps[:pos], first, *rest])


def _tail(s: TraceSample, pos: int, kind: str) -> list[TraceStep]:
    return s.steps[pos:] if len(s.steps) > pos and s.steps[pos].kind == kind else []


def _median_tail(others: Sequence[TraceSample], pos: int, kind: str) -> list[TraceStep]:
    running = sorted((s for s in others if _tail(s, pos, kind)), key=lambda s: (len(s.steps), s.index))
    return _tail(running[len(running) // 2], pos, kind) if running else []


def _last_step(asked: TraceStep, mine: TraceSample) -> TraceStep:
    """A step of the asked kind that ends the chain, with the member's typical duration and length."""
    same = [st for st in mine.steps if st.kind == asked.kind] or list(mine.steps)
    duration = statistics.median(st.duration_s or 0.0 for st in same) if same else 0.0
    out = statistics.median(st.output_tokens or 1 for st in same) if same else 1
    return TraceStep(index=asked.index, kind=asked.kind, duration_s=duration, prompt_tokens=asked.prompt_tokens,
                     output_tokens=int(out) if asked.kind == INFERENCE else None,
                     done=asked.kind != INFERENCE)  # fmt: skip
