"""Admission orders: the order samples queue for admission, on both clocks.

Pure functions of the samples' priors (history of the same tasks): the live flow (flows/batch.py)
and the virtual-time driver (sim/virtual_time/simulation.py) both call `admission_sequence`.

- "arrival": as given (trace or workload order).
- "longest_prior_first": longest expected chain first (LPT, `prior_chain_steps`), samples without
  a prior after, each group in the given order.
- "longest_tail_first": only the longest tenth (LONG_TAIL_SHARE, at least one) of the samples with
  a prior first, longest first, then the rest as given.
- "kv_balanced": LPT within the engines' KV capacity (`kv_balanced_sequence`): the longest chains
  still start first, but a chain whose growing context would, beside those admitted with it,
  overflow the KV cache before it ends waits for a later place; shorter or smaller chains take the
  places between. LPT alone co-admits the longest chains, whose contexts grow together and peak
  together on a KV-bound engine, evicting each other's prefixes (docs/ablation.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from agentbatch.scheduling.types import SampleProgress

LONG_TAIL_SHARE = 0.1  # "longest_tail_first": the share of samples (with a prior) admitted first
AdmissionOrder = Literal["arrival", "longest_prior_first", "longest_tail_first", "kv_balanced"]
ADMISSION_ORDERS: tuple[AdmissionOrder, ...] = get_args(AdmissionOrder)


@dataclass(frozen=True, slots=True)
class AdmissionHints:
    """What a KV-aware order knows beyond the chain-length priors.

    `context_tokens`: task id -> the context the sample is expected to reach (tokens of its largest
    prompt, less a prefix shared with other samples), from earlier runs of the task.
    `admitted`: samples admitted at once at the start (the admission limit).
    `kv_tokens`: the engines' KV capacity in tokens, all workers together."""

    context_tokens: Mapping[str, float]
    admitted: int
    kv_tokens: float


def admission_sequence(samples: Sequence[SampleProgress], order: str,
                       hints: AdmissionHints | None = None) -> list[SampleProgress]:
    """The order samples queue for admission (module docstring). "kv_balanced" without `hints`
    orders as "longest_prior_first"."""
    if order in ("arrival", "trace"):
        return list(samples)
    if order not in ADMISSION_ORDERS:
        raise ValueError(f"admission_order must be one of {', '.join(map(repr, ADMISSION_ORDERS))}, "
                         f"got {order!r}")
    if order == "longest_tail_first":
        return longest_tail_first(samples)
    if order == "kv_balanced" and hints is not None:
        return kv_balanced_sequence(samples, hints)
    return longest_prior_first(samples)


def longest_prior_first(samples: Sequence[SampleProgress]) -> list[SampleProgress]:
    return [s for _, s in sorted(enumerate(samples), key=lambda e: (e[1].prior_chain_steps is None,
                                                                    -(e[1].prior_chain_steps or 0.0), e[0]))]


def longest_tail_first(samples: Sequence[SampleProgress]) -> list[SampleProgress]:
    ranked = longest_prior_first(samples)
    known = sum(s.prior_chain_steps is not None for s in samples)
    head = ranked[:max(1, round(known * LONG_TAIL_SHARE))] if known else []
    first = {id(s) for s in head}
    return head + [s for s in samples if id(s) not in first]


def kv_balanced_sequence(samples: Sequence[SampleProgress], hints: AdmissionHints) -> list[SampleProgress]:
    """LPT list scheduling within the KV capacity, played forward on the priors alone.

    `hints.admitted` samples run at once, each for its expected chain steps, its context growing
    linearly to its expected peak at its end. Whenever one ends, the next place in the order goes to
    the longest waiting chain whose context fits beside the running ones' at every instant until
    it ends (`hints.kv_tokens`), or, when none fits, to the one with the smallest context. Where
    everything fits this is LPT. Samples without a chain prior or a context prior come after, in the
    given order."""
    known, tail = _split_known(samples, hints.context_tokens)
    steps = np.array([float(s.prior_chain_steps or 0.0) for s in known])
    peaks = np.array([float(hints.context_tokens[s.task_id]) for s in known])
    waiting = np.ones(len(known), dtype=bool)
    plan = _KvPlan(hints.kv_tokens)
    out: list[SampleProgress] = []
    for _ in range(len(known)):
        if len(plan.ends) >= max(1, hints.admitted):
            plan.end_first()
        pick = plan.first_fitting(steps, peaks, waiting)
        waiting[pick] = False
        plan.add(steps[pick], peaks[pick])
        out.append(known[pick])
    return out + tail


def _split_known(samples: Sequence[SampleProgress], context: Mapping[str, float],
                 ) -> tuple[list[SampleProgress], list[SampleProgress]]:
    """The samples with both priors, longest chain first, and the others as given."""
    known = [s for s in longest_prior_first(samples) if s.prior_chain_steps is not None and s.task_id in context]
    chosen = {id(s) for s in known}
    return known, [s for s in samples if id(s) not in chosen]


def _ramps_at(starts: np.ndarray, ends: np.ndarray, peaks: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Context of ramps (rows of t: instants; columns: ramps) growing from nothing at their start
    to their peak at their end, nothing outside."""
    span = ends - starts
    live = (t >= starts) & (t <= ends) & (span > 0)
    context: np.ndarray = np.where(live, peaks * (t - starts) / np.where(span > 0, span, 1.0), 0.0)
    return context


class _KvPlan:
    """The running samples of `kv_balanced_sequence`, each a ramp from `starts` to `ends` (steps)
    up to `peaks` tokens, and `totals`: all running contexts at each one's end (a sum of rising
    ramps that drop at their ends peaks just before some end)."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.now = 0.0
        self.starts = self.ends = self.peaks = self.totals = np.zeros(0)

    def first_fitting(self, steps: np.ndarray, peaks: np.ndarray, waiting: np.ndarray) -> int:
        """The first waiting sample (longest chain) that fits, else the waiting one with the
        smallest context."""
        idx = np.flatnonzero(waiting)
        for chunk in (idx[:32], idx[32:]):  # the longest usually fit: try them before all the rest
            if chunk.size and (ok := self._fits(steps[chunk], peaks[chunk])).any():
                return int(chunk[np.argmax(ok)])
        return int(idx[np.argmin(peaks[idx])])

    def _fits(self, steps: np.ndarray, peaks: np.ndarray) -> np.ndarray:
        ends = (self.now + steps)[:, None]
        own_end = _ramps_at(self.starts, self.ends, self.peaks, ends).sum(axis=1) + peaks
        own = _ramps_at(np.full_like(ends, self.now), ends, peaks[:, None], self.ends[None, :])
        fits: np.ndarray = (own_end <= self.budget) & (self.totals + own <= self.budget).all(axis=1)
        return fits

    def add(self, steps: float, peak: float) -> None:
        start, end = self.now, self.now + steps
        self.totals = self.totals + _ramps_at(np.array(start), np.array(end), np.array(peak), self.ends)
        self.starts, self.ends = np.append(self.starts, start), np.append(self.ends, end)
        self.peaks = np.append(self.peaks, peak)
        self.totals = np.append(self.totals, _ramps_at(self.starts, self.ends, self.peaks, np.array(end)).sum())

    def end_first(self) -> None:
        k = int(np.argmin(self.ends))
        start, end, peak = np.array(self.starts[k]), np.array(self.ends[k]), np.array(self.peaks[k])
        self.starts, self.ends, self.peaks, self.totals = (np.delete(a, k) for a in
                                                           (self.starts, self.ends, self.peaks, self.totals))
        self.now = float(end)
        self.totals = self.totals - _ramps_at(start, end, peak, self.ends)
