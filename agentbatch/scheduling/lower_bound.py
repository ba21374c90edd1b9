"""Makespan lower bound: no schedule can finish a batch sooner than this.

LB = max(longest chain at zero contention, inference work / inference capacity,
environment work / environment slots). Each term is a valid bound on its own: a chain's steps
run one after another; the workers and the environment slots cannot do more than their combined
capacity per second. Callers decide how they measure work (see the parameters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

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
