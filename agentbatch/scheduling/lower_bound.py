"""Makespan lower bound: no schedule can finish a batch sooner than this.

LB = max(longest chain at zero contention, inference work / inference capacity,
environment work / environment slots). Each term is a valid bound on its own: a chain's steps
run one after another; the workers and the environment slots cannot do more than their combined
capacity per second. Callers decide how they measure work (see the parameters).

`window_bound` is the tighter bound beside it: it charges the chains and the capacity jointly
(a resource cannot be busy before the samples reach it nor after they leave it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Order used to break ties in `binding`: a chain-bound batch cannot be helped by more hardware,
# so it is reported first when terms are equal.
_TERMS = ("chain", "inference", "environment")


@dataclass(frozen=True)
class LowerBound:
    longest_chain_s: float  # longest sample chain at zero contention (sum of its steps' service times)
    inference_bound_s: float  # total inference work / inference capacity
    environment_bound_s: float  # total environment work / environment slots

    @property
    def value(self) -> float:
        return max(self.longest_chain_s, self.inference_bound_s, self.environment_bound_s)

    @property
    def binding(self) -> str:
        """Which term sets the bound: "chain" | "inference" | "environment"."""
        terms = dict(zip(_TERMS, (self.longest_chain_s, self.inference_bound_s, self.environment_bound_s),
                         strict=True))
        best = self.value
        return next(name for name in _TERMS if terms[name] == best)

    def ratio(self, makespan_s: float) -> float:
        """makespan / LB (>= 1 for any real schedule); inf when the bound is zero."""
        v = self.value
        return makespan_s / v if v > 0 else math.inf


def _check(name: str, x: float) -> float:
    x = float(x)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {x!r}")
    return x


def makespan_lower_bound(
    chain_s: Iterable[float],
    inference_work_s: float,
    inference_capacity: float,
    env_work_s: float,
    env_slots: int,
) -> LowerBound:
    """Combine the three bounds.

    chain_s: each sample's chain at zero contention (sum of its steps' service times).
    inference_work_s: worker-busy seconds at full batching efficiency (e.g. from a cost model).
    inference_capacity: how many such workers run in parallel (number of engine workers).
    env_work_s: sum of environment execution times; env_slots: environment slots in parallel.
    A zero capacity with non-zero work means the batch can never finish: the bound is inf.
    """
    longest = max((_check("chain_s item", c) for c in chain_s), default=0.0)
    inf_work = _check("inference_work_s", inference_work_s)
    cap = _check("inference_capacity", inference_capacity)
    env_work = _check("env_work_s", env_work_s)
    slots = _check("env_slots", env_slots)
    return LowerBound(
        longest_chain_s=longest,
        inference_bound_s=_divide(inf_work, cap),
        environment_bound_s=_divide(env_work, slots),
    )


def _divide(work: float, capacity: float) -> float:
    if work == 0:
        return 0.0
    return work / capacity if capacity > 0 else math.inf


def window_bound(heads: Sequence[float], works: Sequence[float], tails: Sequence[float], capacity: float,
                 overhead: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """A tighter bound on one resource: the work of every sample lies between its head and its tail.

    Sample i cannot use the resource before `heads[i]` (the steps of its chain before its first use,
    at zero contention) nor after makespan - `tails[i]` (the steps after its last use). So for any
    set J of samples the resource must do their work `works` in [min head, makespan - min tail]:
    makespan >= min_J head + sum_J work / capacity + min_J tail (Jackson's bound with release and
    delivery times, preemption allowed, hence a bound for any schedule). The best J for given
    thresholds (head >= a, tail >= b) holds every sample meeting them (more work only raises the
    bound), so trying every pair of thresholds finds the maximum. `overhead(order)` may add work
    that depends on the set: given sample indices, it returns for each prefix order[:k+1] the work
    beyond `works` that set needs (e.g. per-iteration costs of its tokens); it must not shrink as the
    set grows. O(n^2 log n)."""
    h = np.asarray(heads, dtype=float)
    w = np.asarray(works, dtype=float)
    t = np.asarray(tails, dtype=float)
    if not (len(h) == len(w) == len(t)) or len(h) == 0 or capacity <= 0:
        return 0.0
    best = 0.0
    for a in np.unique(h):
        idx = np.flatnonzero(h >= a)
        order = idx[np.argsort(-t[idx], kind="stable")]  # tails descending: J = a prefix of `order`
        work = np.cumsum(w[order])
        if overhead is not None:
            work = work + overhead(order)
        best = max(best, float(np.max(a + work / capacity + t[order])))
    return best
