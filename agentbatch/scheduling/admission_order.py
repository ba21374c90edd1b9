"""Admission orders: the order samples queue for admission, on both clocks.

Pure functions of the samples' priors (history of the same tasks): the live flow (flows/batch.py)
and the virtual-time driver (sim/virtual_time/simulation.py) both call `admission_sequence`.

- "arrival": as given (trace or workload order).
- "longest_prior_first": longest expected chain first (LPT, `prior_chain_steps`), samples without
  a prior after, each group in the given order.
- "longest_tail_first": only the longest tenth (LONG_TAIL_SHARE, at least one) of the samples with
  a prior first, longest first, then the rest as given.
- "kv_balanced": LPT within a KV budget (`kv_balanced_sequence`): the longest chains still start
  first, but the expected context tokens of the samples admitted at once stay within the engines'
  KV capacity, so long-context chains are interleaved with short ones instead of co-admitted,
  where they would evict each other's prefixes (docs/ablation.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentbatch.scheduling.types import SampleProgress

LONG_TAIL_SHARE = 0.1  # "longest_tail_first": the share of samples (with a prior) admitted first
ADMISSION_ORDER_NAMES = ("arrival", "longest_prior_first", "longest_tail_first", "kv_balanced")


@dataclass(frozen=True, slots=True)
class AdmissionHints:
    """What a KV-aware order knows beyond the chain-length priors.

    `context_tokens`: task id -> expected context tokens the sample holds in the KV cache, averaged
    over its chain (its own tokens, not a prefix shared with other samples), from earlier runs.
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
    if order not in ADMISSION_ORDER_NAMES:
        raise ValueError(f"admission_order must be one of {', '.join(map(repr, ADMISSION_ORDER_NAMES))}, "
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
    """LPT list scheduling under a KV budget, on the priors alone.

    It plays the batch forward on the priors: `hints.admitted` samples run at once, each for its
    expected chain steps; whenever one ends the next place in the order goes to the longest waiting
    chain whose expected context fits in what the running ones leave of `hints.kv_tokens`, or, when
    none fits, to the one with the smallest context. Where everything fits this is LPT. Samples
    without a chain prior or a context prior come after, in the given order."""
    known = [s for s in longest_prior_first(samples)
             if s.prior_chain_steps is not None and s.task_id in hints.context_tokens]
    chosen = {id(s) for s in known}
    tail = [s for s in samples if id(s) not in chosen]
    out: list[SampleProgress] = []
    running: list[tuple[float, int, float]] = []  # (expected end, place, context tokens)
    used, now = 0.0, 0.0
    width = max(1, hints.admitted)
    while known:
        if len(running) >= width:
            now, _, freed = heapq.heappop(running)
            used -= freed
        pick = _fitting(known, hints, hints.kv_tokens - used)
        s = known.pop(pick)
        ctx = hints.context_tokens[s.task_id]
        heapq.heappush(running, (now + float(s.prior_chain_steps or 0.0), len(out), ctx))
        used += ctx
        out.append(s)
    return out + tail


def _fitting(ranked: list[SampleProgress], hints: AdmissionHints, room: float) -> int:
    """Index of the longest chain (ranked longest first) whose context fits in `room`, else of the
    smallest context (the longest among equals)."""
    ctx = hints.context_tokens
    for i, s in enumerate(ranked):
        if ctx[s.task_id] <= room:
            return i
    return min(range(len(ranked)), key=lambda i: (ctx[ranked[i].task_id], i))
