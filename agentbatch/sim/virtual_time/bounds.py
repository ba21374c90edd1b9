"""The makespan lower bound of a trace on given hardware, from the engine profile's cost model.

Each term under-estimates on purpose, so the bound stays valid whatever the engine model does:
- a chain at zero contention: environment durations + for every inference call one prefill of the
  tokens not in its own previous context (the shared system prefix counts as cached), in chunks of
  the token budget, and (output - 1) decode iterations of one sequence (the last prefill iteration
  emits the first token); prefill-attention FLOPs are left out.
- inference work at full batching efficiency: per-token and per-context costs summed over every
  call, plus the fixed per-iteration cost c0 times the fewest iterations any schedule needs: tokens /
  token budget of an iteration (max_num_batched_tokens: the per-request prefill threshold caps one
  request's chunk, not the iteration, so it bounds only the chain term), decode tokens / max_num_seqs (or state slots), and attended *private* context / KV
  capacity (the sequences decoding in one iteration must hold their own contexts in the cache at
  once; a shared prefix is stored once, so it is left out of this term).

The tight bound (`trace_tight_bound`) adds, for each resource, the window bound of
scheduling/lower_bound.py: a sample's environment work cannot start before the inference steps
that precede it in its chain nor end after the time its remaining steps need, and likewise for its
inference work; the same zero-contention step times as the chain term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from agentbatch.scheduling.lower_bound import LowerBound, makespan_lower_bound, window_bound
from agentbatch.sim.profiles import EngineProfile
from agentbatch.traces.schema import INFERENCE, Trace


@dataclass
class PerSample:
    """Per sample (one entry each): its chain before its first and after its last step of each
    kind at zero contention, its environment work, its inference work without per-iteration costs,
    and the token counts that fix how many iterations its calls need at least. A sample without
    steps of a kind has head, tail and work 0 there."""

    # (heads, works, tails), one entry per sample
    env: tuple[list[float], list[float], list[float]] = field(default_factory=lambda: ([], [], []))
    inf: tuple[list[float], list[float], list[float]] = field(default_factory=lambda: ([], [], []))
    tokens: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    private: list[float] = field(default_factory=list)
    chain: list[float] = field(default_factory=list)  # the whole chain at zero contention

    def add(self, steps: list[tuple[bool, float, float]], tokens: float, decode: float, private: float) -> None:
        """`steps`: (is environment, zero-contention seconds, work seconds) of one chain, in order."""
        for env, (heads, works, tails) in ((True, self.env), (False, self.inf)):
            mine = [i for i, st in enumerate(steps) if st[0] == env]
            heads.append(sum(st[1] for st in steps[:mine[0]]) if mine else 0.0)
            tails.append(sum(st[1] for st in steps[mine[-1] + 1:]) if mine else 0.0)
            works.append(sum(steps[i][2] for i in mine))
        self.tokens.append(tokens)
        self.decode.append(decode)
        self.private.append(private)
        self.chain.append(sum(st[1] for st in steps))


@dataclass(frozen=True)
class TraceWork:
    chain_s: list[float]
    inference_work_s: float  # one worker's busy seconds, summed over calls
    env_work_s: float
    per_sample: PerSample = field(default_factory=PerSample)


@dataclass(frozen=True)
class _Caps:
    """What bounds the fewest iterations: tokens per iteration, sequences per iteration, KV tokens."""

    budget: int
    seqs: int
    kv: int

    def iterations(self, tokens: float | np.ndarray, decode: float | np.ndarray,
                   private: float | np.ndarray) -> float | np.ndarray:
        return np.maximum(np.maximum(np.asarray(tokens) / self.budget, np.asarray(decode) / self.seqs),
                          np.asarray(private) / self.kv)


def _caps(profile: EngineProfile) -> _Caps:
    seqs = profile.max_num_seqs if profile.state_slots is None else min(profile.max_num_seqs, profile.state_slots)
    return _Caps(max(1, profile.max_num_batched_tokens), max(1, seqs), max(1, profile.kv_capacity_tokens))


def trace_work(trace: Trace, profile: EngineProfile, env_time_scale: float = 1.0) -> TraceWork:
    c = profile.cost
    chunk = max(1, profile.max_num_batched_tokens)  # prefill tokens of ONE request in one iteration
    if profile.long_prefill_token_threshold:
        chunk = min(chunk, profile.long_prefill_token_threshold)
    per = PerSample()
    for s in trace.samples:
        steps: list[tuple[bool, float, float]] = []
        tokens = decode = 0
        private = 0.0  # attended context beyond the shared prefix, summed over decode tokens
        prev_ctx = s.shared_prefix_tokens  # tokens of this sample already in a cache
        for st in s.steps:
            if st.kind != INFERENCE:
                d = (st.duration_s or 0.0) * env_time_scale
                steps.append((True, d, d))
                continue
            p = int(st.prompt_tokens or 0)
            o = max(1, int(st.output_tokens or 1))
            cached = min(prev_ctx, p - 1) if profile.enable_prefix_caching else 0
            cached -= cached % profile.block_size  # hits come in whole blocks
            new = max(1, p - cached)
            dec = o - 1
            attended = dec * p + dec * (dec - 1) / 2
            variable = c.c_prefill * new + c.c_decode * dec + c.c_attn * attended
            steps.append((False, math.ceil(new / chunk) * c.c0 + c.c_prefill * new + dec * (c.c0 + c.c_decode)
                          + c.c_attn * attended, variable))  # fmt: skip
            tokens += new + dec
            decode += dec
            private += attended - dec * min(s.shared_prefix_tokens, p)
            prev_ctx = p + o
        per.add(steps, tokens, decode, private)
    iterations = _caps(profile).iterations(sum(per.tokens), sum(per.decode), sum(per.private))
    variable_s = sum(per.inf[1])
    return TraceWork(chain_s=list(per.chain), inference_work_s=variable_s + c.c0 * float(iterations),
                     env_work_s=sum(per.env[1]), per_sample=per)  # fmt: skip


def trace_lower_bound(
    trace: Trace, profile: EngineProfile, workers: int, env_slots: int, env_time_scale: float = 1.0
) -> LowerBound:
    w = trace_work(trace, profile, env_time_scale)
    return makespan_lower_bound(w.chain_s, w.inference_work_s, workers, w.env_work_s, env_slots)


@dataclass(frozen=True)
class TightBound:
    """The plain bound's terms and the window bounds of both resources; `value` is the largest."""

    plain: LowerBound
    environment_window_s: float
    inference_window_s: float

    @property
    def value(self) -> float:
        return max(self.plain.value, self.environment_window_s, self.inference_window_s)


def trace_tight_bound(
    trace: Trace, profile: EngineProfile, workers: int, env_slots: int, env_time_scale: float = 1.0
) -> TightBound:
    """LB with the window bound of each resource (module docstring); never below the plain LB."""
    w = trace_work(trace, profile, env_time_scale)
    per = w.per_sample
    plain = makespan_lower_bound(w.chain_s, w.inference_work_s, workers, w.env_work_s, env_slots)
    caps, c0 = _caps(profile), profile.cost.c0
    arrays = [np.asarray(x, dtype=float) for x in (per.tokens, per.decode, per.private)]

    def iteration_costs(order: np.ndarray) -> np.ndarray:
        tok, dec, priv = (np.cumsum(a[order]) for a in arrays)
        return c0 * np.asarray(caps.iterations(tok, dec, priv))

    env = window_bound(*per.env, env_slots) if env_slots > 0 else math.inf
    inf = window_bound(*per.inf, workers, overhead=iteration_costs) if workers > 0 else math.inf
    return TightBound(plain, env, inf)
