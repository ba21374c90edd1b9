"""Choosing a policy by simulating the portfolio (`scheduling.policy: auto`).

Every candidate of the portfolio (agentbatch/scheduling/portfolio.py, the baselines among them) is
simulated in virtual time on each member of an ensemble: the batch's own tasks with the best
priors available (with history: the chain lengths and contexts an earlier run of the same tasks
reached; without: traces drawn from the workload's declared or observed distribution), on the
configured engines and slots. `choose` then picks by the robust minimax rule. Simulations that can no
longer win are cut as soon as their virtual clock passes the makespan they would need (a bound,
not an estimate: a cut run's makespan is known to be larger), and a candidate that runs alike to one
already simulated on a member takes that run's result, which keeps deciding cheap: alike where they
differ only in what cannot decide anything there (with one worker the router; with every sample
admitted at once the admission limit and control; orders that give the same order, as every order
does for samples an external harness sends: VirtualConfig.harness) or in a policy
that decided nothing in that run (a queue that never held two waiting steps, an adaptive admission
limit that never moved: `VirtualBatch.decided`).

Plugins add candidates through the entry-point group `agentbatch.candidates`: an entry point names
a `Candidate` or a sequence of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from agentbatch.scheduling.policies import FcfsPriority
from agentbatch.scheduling.portfolio import Candidate, Choice, applicable, candidates, choose
from agentbatch.scheduling.registry import PolicySpec, make_priority
from agentbatch.sim.virtual_time.simulation import (
    WATCHED_POLICIES,
    SimulationCut,
    VirtualBatch,
    VirtualConfig,
    admission_order,
)
from agentbatch.traces.schema import Trace

CANDIDATE_GROUP = "agentbatch.candidates"
BASELINE_SLACK = 1.25  # a baseline is cut at this multiple of the member's best baseline so far


@cache
def plugin_candidates() -> tuple[Candidate, ...]:
    """Candidates added by installed packages (entry points of `agentbatch.candidates`)."""
    out: list[Candidate] = []
    for ep in sorted(entry_points(group=CANDIDATE_GROUP), key=lambda e: e.name):
        obj = ep.load()
        items = [obj] if isinstance(obj, Candidate) else list(obj)
        for c in items:
            if not isinstance(c, Candidate):
                raise TypeError(f"entry point {ep.name} = {ep.value} ({CANDIDATE_GROUP}) must give Candidate "
                                f"objects, got {type(c).__name__}")
            out.append(c)
    return tuple(out)


def portfolio() -> list[Candidate]:
    """The registry: built-in candidates, then the plugins'."""
    return candidates(plugin_candidates())


@dataclass(frozen=True)
class Member:
    """One ensemble member: a trace of the batch's tasks and the priors its candidates get."""

    trace: Trace
    priors: dict[str, float] | None = None  # task id -> expected chain steps
    context_priors: dict[str, float] | None = None  # task id -> context reached (kv_balanced)


def candidate_config(c: Candidate, base: VirtualConfig, *, samples: int, n_ref: int,
                     priors: dict[str, float] | None = None,
                     context_priors: dict[str, float] | None = None) -> VirtualConfig:
    """The virtual-time config of a candidate on the hardware and slots of `base`."""
    with_priors = c.uses_priors and priors
    return replace(
        base, coupled=c.coupled, per_worker_inflight=None,
        max_active=c.admission_limit(samples=samples, env_slots=base.env_slots, n_ref=n_ref),
        env_queue=PolicySpec(c.env_queue, dict(c.env_queue_params)), inference_queue=PolicySpec(c.inference_queue),
        router=PolicySpec(c.router), priority=PolicySpec(c.priority), admission_order=c.admission_order,
        admission_control=c.admission_control, priors=dict(priors) if with_priors and priors else None,
        context_priors=dict(context_priors) if with_priors and context_priors else None,
    )  # fmt: skip


@dataclass
class Decision:
    """What `decide` found: the choice, each candidate's predicted makespans (one per member; inf
    where cut) and where a cut one stopped, and the wall time spent deciding."""

    choice: Choice
    candidates: list[Candidate]
    predictions: dict[str, list[float]]
    cut_at: dict[str, list[float]] = field(default_factory=dict)
    decide_s: float = 0.0
    members: int = 1
    simulations: int = 0
    decide_cpu_s: float = 0.0  # CPU seconds of this process (wall time also counts other load)

    @property
    def chosen(self) -> Candidate:
        return next(c for c in self.candidates if c.name == self.choice.name)

    def to_dict(self) -> dict[str, Any]:
        """The run summary's `policy` section (summary.json, the store, the report, the artifact)."""
        rows = []
        for c in self.candidates:
            preds = self.predictions[c.name]
            rows.append({
                "name": c.name, "baseline": c.baseline,
                "predicted_makespan_s": [None if math.isinf(x) else round(x, 3) for x in preds],
                "cut_above_s": [round(x, 3) if x else None for x in self.cut_at.get(c.name, [0.0] * len(preds))],
                "score": None if math.isinf(self.choice.scores[c.name]) else round(self.choice.scores[c.name], 4),
            })  # fmt: skip
        return {
            "mode": "auto", "chosen": self.choice.name, "score": round(self.choice.score, 4),
            "fallback": self.choice.fallback, "fallback_score": round(self.choice.fallback_score, 4),
            "rule": self.choice.rule, "members": self.members, "simulations": self.simulations,
            "decide_s": round(self.decide_s, 3), "decide_cpu_s": round(self.decide_cpu_s, 3), "candidates": rows,
        }  # fmt: skip


def decide(members: Sequence[Member], base: VirtualConfig, *, n_ref: int,
           pool: Sequence[Candidate] | None = None, margin: float = 0.01) -> Decision:
    """Simulate the portfolio on every member and choose (module docstring)."""
    if not members:
        raise ValueError("decide needs at least one ensemble member")
    start, cpu = time.perf_counter(), time.process_time()
    has_priors = all(m.priors for m in members)
    pool = applicable(pool if pool is not None else portfolio(), has_priors)
    run = _Runner(members, base, n_ref)
    run.all(pool, margin)
    choice = choose(run.pred, pool, margin)
    return Decision(choice, list(pool), run.pred, run.cut_at, time.perf_counter() - start, len(members), run.sims,
                    time.process_time() - cpu)


class _Runner:
    """Runs candidates on the members, cutting those that cannot win."""

    def __init__(self, members: Sequence[Member], base: VirtualConfig, n_ref: int) -> None:
        self.members, self.base, self.n_ref = members, base, n_ref
        self.pred: dict[str, list[float]] = {}
        self.cut_at: dict[str, list[float]] = {}
        self.sims = 0
        self.cuts_in = [0] * len(members)  # non-baselines cut in each member so far
        self._runs: list[list[KnownRun]] = [[] for _ in members]  # the runs simulated on each member

    def _one(self, c: Candidate, i: int, stop: float | None) -> tuple[float, float]:
        """c's makespan on member i, or (inf, where it stopped) when cut at `stop`. A candidate that
        runs alike to one already run there (`KnownRun.answers`) takes that run's result where it
        answers: a makespan (cut if above the stop), or a cut at a stop no higher."""
        m = self.members[i]
        cfg = candidate_config(c, self.base, samples=len(m.trace.samples), n_ref=self.n_ref, priors=m.priors,
                               context_priors=m.context_priors)  # fmt: skip
        parts = run_parts(m.trace, cfg)
        limit = math.inf if stop is None else stop
        for run in self._runs[i]:
            known = run.answers(parts, limit)
            if known is not None:
                return known
        self.sims += 1
        batch = VirtualBatch(m.trace, cfg)
        try:
            out = batch.run(stop_after_s=stop).makespan_s, 0.0
        except SimulationCut as cut:
            out = math.inf, cut.at_s
        self._runs[i].append(KnownRun(parts, batch.decided(), *out, limit))
        return out

    def all(self, pool: Sequence[Candidate], margin: float) -> None:
        """The baselines first (they fix the best baseline of each member and the fallback), then the
        others in order, each cut where it could no longer be chosen: above (1 - margin) x the
        fallback's makespan in a member (the rule's condition), or where its ratio to the best
        baseline reaches the best score so far."""
        bases = [c for c in pool if c.baseline]
        for c in sorted(bases, key=_likely_fast):
            self.baseline(c)
        n = len(self.members)
        best_base = [min(self.pred[c.name][m] for c in bases) for m in range(n)]
        scores = {c.name: max(t / b for t, b in zip(self.pred[c.name], best_base, strict=True)) for c in bases}
        fallback = min(bases, key=lambda c: scores[c.name])
        floor = [(1 - margin) * t for t in self.pred[fallback.name]]
        best = math.inf
        for c in pool:
            if not c.baseline:
                best = min(best, self.other(c, best_base, floor, best))

    def baseline(self, c: Candidate) -> None:
        """Every member, each cut at BASELINE_SLACK x the best baseline there so far."""
        preds, cuts = [], []
        for i in range(len(self.members)):
            done = [p[i] for n, p in self.pred.items() if len(p) > i]
            stop = BASELINE_SLACK * min(done) if done and math.isfinite(min(done)) else None
            t, at = self._one(c, i, stop)
            preds.append(t)
            cuts.append(at)
        self.pred[c.name], self.cut_at[c.name] = preds, cuts

    def other(self, c: Candidate, best_base: list[float], floor: list[float], best: float) -> float:
        """Member by member, each cut where it could not be chosen (above `floor`, or at the ratio
        `best` to the best baseline); once cut, the other members are not simulated. Returns its
        score (worst ratio to the best baseline; inf when cut)."""
        preds, cuts = [math.inf] * len(self.members), [0.0] * len(self.members)
        for i in sorted(range(len(self.members)), key=lambda i: -self.cuts_in[i]):  # the likeliest cut first
            stop = min(floor[i], best * best_base[i])
            preds[i], cuts[i] = self._one(c, i, stop if math.isfinite(stop) else None)
            if math.isinf(preds[i]):
                self.cuts_in[i] += 1
                break
        self.pred[c.name], self.cut_at[c.name] = preds, cuts
        return max(t / b for t, b in zip(preds, best_base, strict=True))


def run_parts(trace: Trace, cfg: VirtualConfig) -> dict[str, Any]:
    """What a run of `cfg` on `trace` depends on, part by part, where candidates differ (the hardware,
    slots and timings are the same for all): the same parts run alike, event for event. Each part
    counts only where it can decide something: with every sample admitted at once (the limit at
    least the samples) neither the limit nor adaptive admission (nothing waits for admission); the
    admission order as the order it gives (orders, priors and context priors that give the same one
    run alike); the priority policy only on engines that schedule by priority (engines launched
    "fcfs" ignore request priorities); with one worker no router (every router routes there). The
    queues and the priority policy read the chain priors, so whether there are any is part of each."""
    limits = cfg.limits(cfg.engine_profile())
    active = limits.effective_active()
    # nothing waits for admission when the limit holds every sample, or every one a harness keeps open
    every = active >= min(len(trace.samples), cfg.harness or len(trace.samples))
    priors = cfg.priors is not None
    fcfs = isinstance(make_priority(cfg.priority.name, **cfg.priority.params), FcfsPriority)
    return {
        "coupled": cfg.coupled,
        "admission_limit": None if every else (limits.max_active_samples, active),
        "admission_control": None if every else cfg.admission_control,
        "admission_order": admission_order(trace, cfg),
        "env_queue": (cfg.env_queue.name, tuple(sorted(cfg.env_queue.params.items())), priors),
        "inference_queue": (cfg.inference_queue.name, tuple(sorted(cfg.inference_queue.params.items())), priors),
        "priority": None if fcfs else (cfg.priority.name, tuple(sorted(cfg.priority.params.items())), priors),
        "router": None if cfg.workers == 1 else (cfg.router.name, tuple(sorted(cfg.router.params.items()))),
    }


@dataclass(frozen=True)
class KnownRun:
    """A run simulated on a member (or a remainder from a checkpoint, sim/replan.py): what it ran
    with, part by part (`run_parts`, `replan.swap_parts`), the parts whose policies decided something
    in it (`VirtualBatch.decided`), its makespan (inf: cut, at `cut_at`) and the stop it ran with."""

    parts: dict[str, Any]
    decided: frozenset[str]
    makespan: float
    cut_at: float
    stop: float

    def answers(self, parts: dict[str, Any], stop: float) -> tuple[float, float] | None:
        """The result of a run with `parts` cut at `stop`, when this run gives it: the two differ only
        in parts whose policies decided nothing here (so they run alike, event for event, as far as
        this one ran), and this one ran to its end or was cut at a stop no lower."""
        if any(parts[k] != v for k, v in self.parts.items() if k in self.decided or k not in WATCHED_POLICIES):
            return None
        if math.isfinite(self.makespan):
            return (self.makespan, 0.0) if self.makespan <= stop else (math.inf, stop)
        return (math.inf, self.cut_at or stop) if self.stop >= stop else None


def _likely_fast(c: Candidate) -> tuple[bool, float]:
    """Baselines that admit more first: the first run of each member goes uncut, and the coupled
    sweep's smallest limits are the slowest (the others are then cut at BASELINE_SLACK x the best)."""
    return c.limit == "slots" and c.limit_factor < 1, -c.limit_factor
