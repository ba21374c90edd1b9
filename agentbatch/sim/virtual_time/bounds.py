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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentbatch.scheduling.lower_bound import LowerBound, makespan_lower_bound
from agentbatch.sim.profiles import EngineProfile
from agentbatch.traces.schema import INFERENCE, Trace


@dataclass(frozen=True)
class TraceWork:
    chain_s: list[float]
    inference_work_s: float  # one worker's busy seconds, summed over calls
    env_work_s: float


def trace_work(trace: Trace, profile: EngineProfile, env_time_scale: float = 1.0) -> TraceWork:
    c = profile.cost
    budget = max(1, profile.max_num_batched_tokens)  # tokens of ALL requests in one iteration
    chunk = budget  # prefill tokens of ONE request in one iteration
    if profile.long_prefill_token_threshold:
        chunk = min(chunk, profile.long_prefill_token_threshold)
    seqs = profile.max_num_seqs if profile.state_slots is None else min(profile.max_num_seqs, profile.state_slots)
    kv_cap = profile.kv_capacity_tokens
    chains: list[float] = []
    total_tokens = total_decode = 0
    private_total = 0.0  # attended context beyond the shared prefix, summed over decode tokens
    variable_s = 0.0
    env_work = 0.0
    for s in trace.samples:
        chain = 0.0
        prev_ctx = s.shared_prefix_tokens  # tokens of this sample already in a cache
        for st in s.steps:
            if st.kind != INFERENCE:
                d = (st.duration_s or 0.0) * env_time_scale
                chain += d
                env_work += d
                continue
            p = int(st.prompt_tokens or 0)
            o = max(1, int(st.output_tokens or 1))
            cached = min(prev_ctx, p - 1) if profile.enable_prefix_caching else 0
            cached -= cached % profile.block_size  # hits come in whole blocks
            new = max(1, p - cached)
            dec = o - 1
            attended = dec * p + dec * (dec - 1) / 2
            chunks = math.ceil(new / chunk)
            chain += chunks * c.c0 + c.c_prefill * new + dec * (c.c0 + c.c_decode) + c.c_attn * attended
            variable_s += c.c_prefill * new + c.c_decode * dec + c.c_attn * attended
            total_tokens += new + dec
            total_decode += dec
            private_total += attended - dec * min(s.shared_prefix_tokens, p)
            prev_ctx = p + o
        chains.append(chain)
    iterations = max(total_tokens / budget, total_decode / max(1, seqs), private_total / max(1, kv_cap))
    return TraceWork(chain_s=chains, inference_work_s=variable_s + c.c0 * iterations, env_work_s=env_work)


def trace_lower_bound(
    trace: Trace, profile: EngineProfile, workers: int, env_slots: int, env_time_scale: float = 1.0
) -> LowerBound:
    w = trace_work(trace, profile, env_time_scale)
    return makespan_lower_bound(w.chain_s, w.inference_work_s, workers, w.env_work_s, env_slots)
