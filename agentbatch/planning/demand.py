"""The memory and throughput arithmetic of the resource model (see resource_model's docstring).

Demand of N cached samples, the largest N that fits, the running batch that keeps the GPU busy,
the expected overflow and recompute under LRU eviction, and the recompute-aware goodput pick.
Pure: stdlib + numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from agentbatch.planning.inputs import GIB, EngineOptions, Hardware
from agentbatch.planning.model_shape import ModelShape


def running_max(n: int, env_fraction: float) -> int:
    """p99 of the number of N admitted samples at the engine at once (Binomial(N, 1 - f), normal approx)."""
    if n <= 0:
        return 0
    p = 1 - env_fraction
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return min(n, max(1, math.ceil(mean + 2.326 * sd)))


@dataclass(frozen=True)
class Demand:
    """Per-sample memory terms shared by the fit, the curve and the SGLang comparison."""

    kv: int  # bytes per token
    s_pad: int  # bytes per state copy as the engine stores it
    tokens_per_sample: float  # mean unique tokens a cached sample holds (context - prefix + block/2)
    sd_tokens: float
    prefix: int
    hybrid: bool
    states_per_running: int
    groups: int = 1

    def mean_bytes(self, n: int, m: int) -> float:
        per = self.tokens_per_sample * self.kv + self.s_pad
        shared = self.groups * (self.prefix * self.kv + (self.s_pad if self.hybrid and self.prefix else 0))
        return n * per + m * (self.states_per_running - 1) * self.s_pad + shared

    def sd_bytes(self, n: int) -> float:
        return math.sqrt(n) * self.sd_tokens * self.kv


def largest(fits: Callable[[int], bool], hi: int = 1 << 22) -> int:
    """Largest n in [0, hi] with fits(n), for a monotone predicate."""
    if not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class BusyBatch:
    batch: int  # B_busy
    how: str  # the cost model used, for the reasoning table
    step: Callable[[float], float]  # decode step time at running batch B


def busy_batch(shape: ModelShape, hw: Hardware, context: float, opts: EngineOptions) -> BusyBatch:
    """Smallest running batch B whose decode throughput reaches busy_fraction of the asymptote."""
    if opts.cost is not None:
        c = opts.cost

        def step(b: float) -> float:
            return c.decode_step(b, context)

        asym = 1.0 / (c.c_decode + c.c_attn * context)
        how = f"cost model: t(B) = {c.c0:g} + B x ({c.c_decode:g} + {c.c_attn:g} x ctx)"
    else:
        wbpp = shape.weights_bytes / shape.total_params if shape.total_params else 2.0
        dense_params = shape.total_params - shape.routed_expert_params
        flops_seq = (
            2 * shape.active_params
            + 4 * context * shape.attention_layers * shape.num_attention_heads * shape.head_dim
        )
        bytes_seq = context * shape.kv_bytes_per_token + 2 * shape.state_bytes_per_seq
        k_over_e = shape.experts_per_token / shape.num_experts if shape.num_experts else 0.0

        def step(b: float) -> float:
            touched = dense_params + shape.routed_expert_params * (1 - (1 - k_over_e) ** b if k_over_e else 1)
            return max(b * flops_seq / hw.peak_flops, (touched * wbpp + b * bytes_seq) / hw.mem_bw)

        asym = 1.0 / max(flops_seq / hw.peak_flops, bytes_seq / hw.mem_bw)
        how = (
            f"roofline: t(B) = max(B x {flops_seq / 1e9:.2f} GFLOP / {hw.peak_flops / 1e12:g} TFLOP/s, "
            f"(weights touched + B x {bytes_seq / 2**20:.1f} MiB) / {hw.mem_bw / 1e12:g} TB/s)"
        )
    target = opts.busy_fraction * asym
    b = largest(lambda n: n / step(n) < target, hi=1 << 20) + 1
    return BusyBatch(b, how, step)


def overflow(mean: float, sd: float, cap: float) -> float:
    """E[max(0, X - cap)] for X ~ Normal(mean, sd^2)."""
    if sd <= 0:
        return max(0.0, mean - cap)
    d = (mean - cap) / sd
    pdf = math.exp(-d * d / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + math.erf(d / math.sqrt(2)))
    return (mean - cap) * cdf + sd * pdf


def returning_evicted(evicted_bytes_fraction: float, env_durations: Sequence[float] | None) -> float:
    """Probability that a sample returning from the environment finds its cache evicted.

    LRU evicts the caches released longest ago, i.e. of the samples that have waited longest. If a
    fraction e of the waiting samples' bytes is evicted, those are the samples whose wait so far
    exceeds an age tau with E[(W - tau)+] / E[W] = e (W: an environment step's duration; at a random
    moment, waiting samples' ages have density P(W > a) / E[W]). A returning sample was evicted iff
    its own wait exceeded tau: probability P(W > tau). Waits are not length-biased on return, so with
    heavy-tailed environment times P(W > tau) < e: the long waits absorb the evictions. Without
    durations (or for exponential ones) it equals e.
    """
    e = min(1.0, max(0.0, evicted_bytes_fraction))
    if not env_durations or e in (0.0, 1.0):
        return e
    model = _age_model(env_durations if isinstance(env_durations, tuple) else tuple(env_durations))
    if model is None:
        return e
    g, p_gt = model
    # g[j] = E[(W - w_j)+] / E[W] at the sorted waits w_j, non-increasing; tau lies after the last
    # w_j with g[j] >= e, and the returns evicted are the waits above it.
    j = int(np.searchsorted(-g, -e, side="right")) - 1
    return 1.0 if j < 0 else float(p_gt[j])


@functools.lru_cache(maxsize=16)
def _age_model(durations: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    w = np.sort(np.asarray(durations, dtype=float))
    total = float(w.sum())
    if total <= 0:
        return None
    n = len(w)
    above = n - np.searchsorted(w, w, side="right")  # count of waits > w_j
    sum_above = total - np.cumsum(w)[np.searchsorted(w, w, side="right") - 1]
    g = (sum_above - w * above) / total
    return g, above / n


@dataclass(frozen=True)
class RecomputePoint:
    """Predicted eviction and recompute at one concurrency (a point of the recompute curve)."""

    concurrency: int
    demand_gib: float
    evicted_fraction: float
    returning_evicted: float
    recompute_tokens_per_step: float
    recompute_ratio: float
    running_overflows: float  # 1.0 when the running set alone overflows the caches (preemption)


def recompute_at(
    n: int,
    dem: Demand,
    cap: float,
    f: float,
    tail: float,
    mean_ctx: float,
    env_durations: Sequence[float] | None = None,
) -> RecomputePoint:
    m = running_max(n, f)
    mean, sd = dem.mean_bytes(n, m), dem.sd_bytes(n)
    over = overflow(mean, sd, cap)
    per_sample = dem.tokens_per_sample * dem.kv + dem.s_pad
    waiting = f * n * per_sample
    running = (1 - f) * n * (per_sample + (dem.states_per_running - 1) * dem.s_pad)
    evict = 1.0 if over > 0 and waiting <= 0 else (min(1.0, over / waiting) if waiting > 0 else 0.0)
    hit = returning_evicted(evict, env_durations)
    recomputed = hit * (mean_ctx - dem.prefix) + tail
    return RecomputePoint(
        concurrency=n,
        demand_gib=mean / GIB,
        evicted_fraction=evict,
        returning_evicted=hit,
        recompute_tokens_per_step=recomputed,
        recompute_ratio=recomputed / mean_ctx,
        running_overflows=float(running + dem.groups * dem.prefix * dem.kv > cap),
    )


@dataclass(frozen=True)
class Goodput:
    """Predicted decode tokens/s at concurrency N, recompute included (one engine worker).

    R = min((1 - f) N, max_running) sequences decode one token per iteration; each finishes an
    inference step every `out` iterations, whose prefill is its new tokens plus the recomputed ones:
        t_iter(N) = t_decode(R) + prefill_s_per_token x R x (new + recompute(N)) / out
        goodput(N) = R / t_iter(N)
    """

    step: Callable[[float], float]
    prefill_s_per_token: float
    out: float
    new: float
    f: float
    max_running: float

    def __call__(self, n: int, recompute: float) -> float:
        r = min((1 - self.f) * n, self.max_running)
        if r <= 0:
            return 0.0
        return r / (self.step(r) + self.prefill_s_per_token * r * (self.new + recompute) / self.out)


@dataclass(frozen=True)
class GoodputPick:
    n: int
    goodput: float  # predicted tokens/s at n
    best: float  # the best predicted tokens/s in the range


def goodput_pick(
    n_fit: int,
    n_busy: int,
    goodput: Goodput,
    recompute: Callable[[int], float],
    running_ok: Callable[[int], bool],
    tolerance: float,
) -> GoodputPick:
    """Smallest N in [n_fit, n_busy] within `tolerance` of the best predicted goodput.
 Beyond N_fit every extra sample adds batch but makes
    returning samples recompute; where recompute is cheap against decode (a short prefill of an
    evicted context vs. many decode iterations) the best N lies past N_fit.
    """
    if n_busy <= n_fit:
        g = goodput(n_busy, recompute(n_busy))
        return GoodputPick(n_busy, g, g)
    stride = max(1, (n_busy - n_fit) // 500)
    grid = list(range(n_fit, n_busy + 1, stride))
    values: list[tuple[int, float]] = []
    for n in grid:
        if n > n_fit and not running_ok(n):
            break
        values.append((n, goodput(n, recompute(n))))
    best = max(g for _, g in values)
    n = next(n for n, g in values if g >= (1 - tolerance) * best)
    return GoodputPick(n, dict(values)[n], best)


def fits_split(
    cache: float, r: float, s: int, kv: int, dem: Demand, f: float, slots_per_running: int, z: float
) -> int:
    """Samples SGLang's two pools, split at ratio r, hold cached (no eviction)."""
    state_slots = cache * r / (1 + r) / s
    kv_tokens = cache / (1 + r) / kv

    def fits(n: int) -> bool:
        m = running_max(n, f)
        tokens = n * (dem.tokens_per_sample) + dem.prefix + z * math.sqrt(n) * dem.sd_tokens
        return n + m * slots_per_running <= state_slots and tokens <= kv_tokens

    return largest(fits)
