"""Resource model for (hybrid) LLM serving of agent batches: memory split and reference concurrency.

Given a model shape, a GPU and an agent workload, compute how many samples to admit at once (the
*reference sample concurrency*) and the engine launch settings that go with it.

The reasoning, in five steps (every step becomes a row of `Plan.rows`, with its formula):

1. **Memory for caches.** C = gpu_mem x util - weights - reserve. One token of context costs
   `kv` = attention_layers x 2 x kv_heads x head_dim x dtype bytes; one sequence's recurrent state
   costs `s` = sum over recurrent layers of (ssm + conv) bytes. In vLLM's hybrid KV-cache manager,
   one page pool holds both, and a state occupies a full attention page: the attention block size is
   raised until `block_size x kv_per_layer >= state_per_layer` (rounded to the kernel alignment, 16),
   the state page is padded up to it (`s_pad`), and with `--mamba-cache-mode align` prefix hits land
   only on block boundaries.
2. **What an admitted sample holds.** A sample alternates inference and environment steps and spends
   a fraction f of its life in the environment. For its next inference step to be a prefix hit, its
   KV (its context beyond the prefix shared by all samples) and one recurrent-state checkpoint must
   stay cached *while it waits*. A running request holds `states_per_running` state copies (the
   working state and the checkpoint it started from). With N admitted samples and at most M of them
   running (M = p99 of Binomial(N, 1-f), the engine's max-num-seqs):

       demand(N) = N x [(ctx - P + block/2) x kv + s_pad] + M x (states_per_running - 1) x s_pad
                   + groups x (P x kv (+ s_pad for the shared prefix's checkpoint, hybrid only))

   ctx is the context of a sample at a random moment of its life (its distribution comes from the
   trace: mean mu, standard deviation sigma), P the shared prefix, block/2 the average unfilled last
   block. The sum over N samples has mean N x mu and spread sqrt(N) x sigma, so we ask
   `demand(N) + z x sqrt(N) x sigma x kv <= C` with z = 1.645 (the caches overflow in <5 % of moments).
   The largest such N is **N_mem**: beyond it, cached samples are evicted and recomputed.
3. **Enough to keep the GPU busy.** Decode throughput B / t(B) rises with the running batch B and
   saturates (weights are read once per step; KV reads and FLOPs grow with B). B_busy is the
   smallest batch reaching `busy_fraction` (0.9) of the asymptotic throughput, from a roofline
   (t(B) = max(FLOPs / peak, bytes / bandwidth), MoE weights touched = 1 - (1 - k/E)^B of the experts)
   or from a linear cost model t(B) = c0 + B x (c_decode + c_attn x ctx). Only a fraction 1 - f of
   the admitted samples are at the engine at any moment, so **N_busy** = ceil(B_busy / (1 - f)).
4. **Reference concurrency** N_ref = min(N_mem, N_busy, batch size): as many samples as keep the GPU
   busy, no more than fit cached. Expected recompute at concurrency N: the mean overflow
   E[max(0, demand - C)] (normal approximation) is taken from the least recently used caches, which
   are those of samples waiting in the environment, a fraction e of their bytes. LRU evicts by age:
   a returning sample lost its cache iff its wait exceeded the age tau with E[(W - tau)+] / E[W] = e
   (`returning_evicted`; with heavy-tailed environment times the few long waits absorb most
   evictions). For a hybrid model losing either the KV or the state checkpoint means recomputing
   the whole context. Add the block/2 tail that block-aligned prefix caching always recomputes.
5. **Recompute against batch size.** When memory binds (N_busy > N_mem) and the workload's output
   and new tokens per step are known, admitting past N_mem can still pay: a bigger running batch
   speeds every decode iteration, while an evicted context costs one (compute-bound) prefill. The
   predicted goodput R / (t_decode(R) + t_prefill x R x (new + recompute(N)) / out), R = (1 - f) N,
   picks N_goodput = the smallest N in [N_mem, N_busy] within 2 % of its maximum, and N_ref uses it
   in place of N_mem (`EngineOptions.allow_recompute=False` keeps the strict no-eviction N_mem).

SGLang sizes its state pool by the balance point r* = (S + D) x token_equiv / L (S state slots per
running request, D draft tokens, token_equiv = s / kv, L the mean context): a split for requests
that all run. An agent batch differs: only ~(1 - f) N samples run, the others hold one checkpoint
each, and the shared prefix's KV is stored once. `Plan.comparison` prints both and what they imply.

Pure: stdlib + numpy, no I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from agentbatch.planning.model_shape import ConfigError, ModelShape, StateLayers, shape_from_config

__all__ = [
    "ConfigError",
    "EngineOptions",
    "Hardware",
    "LinearCost",
    "ModelShape",
    "Plan",
    "PlanError",
    "Row",
    "StateLayers",
    "Workload",
    "plan",
    "reference_concurrency",
    "returning_evicted",
    "shape_from_config",
    "vllm_block_size",
]

GIB = 1 << 30


class PlanError(ValueError):
    """The inputs admit no plan (e.g. the weights do not fit); the message says which input."""


@dataclass(frozen=True)
class Hardware:
    """One GPU. Defaults: an H200 SXM (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s dense BF16).

    reserve_bytes: memory kept outside the caches for activations at max-num-batched-tokens, CUDA
      graphs and non-torch allocations (vLLM profiles it at start; 2-4 GiB is typical for one GPU).
    """

    gpu_mem_bytes: int
    gpu_util: float = 0.9
    reserve_bytes: int = 3 * GIB
    peak_flops: float = 989e12
    mem_bw: float = 4.8e12
    name: str = "GPU"

    def __post_init__(self) -> None:
        if not 0 < self.gpu_util <= 1:
            raise PlanError(f"gpu_util must be in (0, 1], got {self.gpu_util}")
        if self.gpu_mem_bytes <= 0:
            raise PlanError(f"gpu memory must be positive, got {self.gpu_mem_bytes}")


@dataclass(frozen=True)
class LinearCost:
    """An engine cost model: one iteration takes c0 + c_prefill x prefill tokens + c_decode x decode
    sequences + c_attn x attended context tokens (seconds); the simulated engine's form."""

    c0: float
    c_prefill: float
    c_decode: float
    c_attn: float

    def decode_step(self, batch: float, context: float) -> float:
        return self.c0 + batch * (self.c_decode + self.c_attn * context)


@dataclass(frozen=True)
class Workload:
    """The agent workload, as far as memory and concurrency care.

    contexts: context lengths (tokens, including the shared prefix) of samples at random moments of
      their life, e.g. every inference step's prompt + output tokens from a trace; their mean and
      spread drive the memory demand.
    env_fraction: share of a sample's time spent waiting on the environment (0..1).
    shared_prefix: tokens every sample's prompt starts with (system prompt, tool schemas).
    peak_context: the longest context any sample reaches (sets --max-model-len).
    num_samples: the batch size, an upper bound on concurrency when known.
    """

    contexts: tuple[float, ...]
    env_fraction: float
    shared_prefix: int = 0
    peak_context: int | None = None
    num_samples: int | None = None
    source: str = "given"
    weights: tuple[float, ...] | None = None  # time each context is held (None = equal)
    output_tokens: float | None = None  # mean output tokens per inference step (for the goodput pick)
    new_tokens: float | None = None  # mean prompt tokens per step not in the previous context (observations)
    prefix_groups: int = 1  # distinct shared prefixes (tool sets), each stored once
    env_durations: tuple[float, ...] | None = None  # environment step durations (seconds), for LRU ages

    def __post_init__(self) -> None:
        if not self.contexts:
            raise PlanError("workload: no context lengths given")
        if any(c <= 0 or not math.isfinite(c) for c in self.contexts):
            raise PlanError("workload: context lengths must be positive numbers")
        if self.weights is not None and (
            len(self.weights) != len(self.contexts)
            or any(w < 0 for w in self.weights)
            or sum(self.weights) <= 0
        ):
            raise PlanError("workload: weights must be one non-negative number per context, not all zero")
        if not 0 <= self.env_fraction < 1:
            raise PlanError(f"workload: env_fraction must be in [0, 1), got {self.env_fraction}")
        if self.shared_prefix < 0 or self.shared_prefix > self.mean_context:
            raise PlanError(
                f"workload: shared_prefix {self.shared_prefix} must be between 0 and the mean context "
                f"{self.mean_context:.0f} (contexts include the shared prefix)"
            )

    @property
    def mean_context(self) -> float:
        return float(np.average(self.contexts, weights=self.weights))

    @property
    def std_context(self) -> float:
        mu = self.mean_context
        return float(math.sqrt(np.average((np.asarray(self.contexts) - mu) ** 2, weights=self.weights)))

    def quantile(self, q: float) -> float:
        x = np.asarray(self.contexts, dtype=float)
        if self.weights is None:
            return float(np.quantile(x, q))
        order = np.argsort(x)
        cum = np.cumsum(np.asarray(self.weights, dtype=float)[order])
        return float(x[order][min(len(x) - 1, int(np.searchsorted(cum, q * cum[-1])))])

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_stats(
        cls,
        mean_context: float,
        p95_context: float | None = None,
        *,
        env_fraction: float,
        shared_prefix: int = 0,
        peak_context: int | None = None,
        num_samples: int | None = None,
        output_tokens: float | None = None,
        new_tokens: float | None = None,
        points: int = 201,
    ) -> Workload:
        """A lognormal context distribution with the given mean and 95th percentile.

        Solves ln p95 = m + 1.645 s and ln mean = m + s^2 / 2 for (m, s) and takes `points` evenly
        spaced quantiles (deterministic, no sampling). Without p95 all samples have the mean context.
        """
        if mean_context <= 0:
            raise PlanError(f"mean context must be positive, got {mean_context}")
        if p95_context is None or p95_context == mean_context:
            contexts: tuple[float, ...] = (float(mean_context),)
        else:
            ratio = math.log(p95_context / mean_context) if p95_context > 0 else -1
            z = 1.6448536269514722
            if ratio <= 0 or ratio >= z * z / 2:
                raise PlanError(
                    f"p95 context {p95_context} must lie between the mean {mean_context} and "
                    f"{mean_context * math.exp(z * z / 2):.0f} (3.87 x mean) for a lognormal fit"
                )
            s = z - math.sqrt(z * z - 2 * ratio)
            m = math.log(mean_context) - s * s / 2
            qs = (np.arange(points) + 0.5) / points
            from statistics import NormalDist

            zs = np.array([NormalDist().inv_cdf(float(q)) for q in qs])
            draws = np.exp(m + s * zs)
            draws *= mean_context / draws.mean()  # exact mean despite the discretisation
            contexts = tuple(float(x) for x in draws)
        return cls(
            contexts=contexts,
            env_fraction=env_fraction,
            shared_prefix=shared_prefix,
            peak_context=peak_context,
            num_samples=num_samples,
            source=f"given: mean {mean_context:g}, p95 {p95_context}",
            output_tokens=output_tokens,
            new_tokens=new_tokens,
        )


@dataclass(frozen=True)
class EngineOptions:
    """How the engines lay out memory; defaults follow vLLM (>= 0.11 hybrid manager) and SGLang.

    states_per_running: state copies a running request holds in vLLM (working state + the cached
      checkpoint it resumed from). sglang_slots_per_running: SGLang's S (extra_buffer = 5,
      extra_buffer_lazy = 4, no_buffer = 3, radix cache off = 1); sglang_draft_tokens: its D.
    busy_fraction: the share of asymptotic decode throughput that counts as "busy".
    target_running: give B_busy directly instead of deriving it.
    """

    block_size: int | None = None
    kernel_block_alignment: int = 16
    dense_block_size: int = 16
    states_per_running: int = 2
    sglang_slots_per_running: int = 5
    sglang_draft_tokens: int = 0
    busy_fraction: float = 0.9
    target_running: int | None = None
    safety_z: float = 1.645
    max_num_batched_tokens: int = 8192
    cost: LinearCost | None = None  # decode cost model for B_busy; None = roofline from Hardware
    allow_recompute: bool = True  # may N_ref pass N_mem where predicted goodput says so
    goodput_tolerance: float = 0.02


@dataclass(frozen=True)
class Row:
    """One line of the reasoning table."""

    quantity: str
    formula: str
    value: float
    unit: str
    note: str = ""

    def value_text(self) -> str:
        return format_value(self.value, self.unit)


def format_value(value: float, unit: str) -> str:
    if unit == "B":
        if abs(value) >= GIB:
            return f"{value / GIB:,.2f} GiB"
        if abs(value) >= 1 << 20:
            return f"{value / (1 << 20):,.2f} MiB"
        if abs(value) >= 1 << 10:
            return f"{value / (1 << 10):,.2f} KiB"
        return f"{value:,.0f} B"
    if unit in ("tokens", "samples", "seqs", "slots", "layers", "tokens/step"):
        return f"{value:,.0f} {unit}" if float(value).is_integer() else f"{value:,.1f} {unit}"
    if unit == "ratio":
        return f"{value:.4g}"
    if unit == "%":
        return f"{value:.2f} %"
    if unit == "s":
        return f"{value * 1e3:.3f} ms"
    return f"{value:,.4g} {unit}".strip()


@dataclass
class Plan:
    """The result: quantities with their reasoning, the concurrency, the engine settings."""

    model: str
    hybrid: bool
    cache_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_seq: int
    block_size: int
    n_mem: int
    n_busy: int
    reference_concurrency: int
    binding: str  # which bound set N_ref: "memory" | "busy" | "batch"
    max_num_seqs: int
    kv_pool_bytes: int
    state_pool_bytes: int
    recompute_tokens_per_step: float
    recompute_ratio: float
    n_goodput: int | None = None  # the recompute-aware pick, when the workload allows it
    rows: list[Row] = field(default_factory=list)
    vllm_args: dict[str, Any] = field(default_factory=dict)
    sglang_args: dict[str, Any] = field(default_factory=dict)
    comparison: list[str] = field(default_factory=list)
    recompute_curve: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def max_active_samples(self) -> int:
        """The admission limit to use (AdmissionLimits.max_active_samples)."""
        return self.reference_concurrency

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) | {"value_text": r.value_text()} for r in self.rows]
        return d

    def vllm_command(self, model: str = "MODEL") -> str:
        return "vllm serve " + model + "".join(_flag(k, v) for k, v in self.vllm_args.items())

    def sglang_command(self, model: str = "MODEL") -> str:
        return (
            "python -m sglang.launch_server --model-path "
            + model
            + "".join(_flag(k, v) for k, v in self.sglang_args.items())
        )

    def table(self) -> str:
        """The reasoning table as aligned plain text."""
        head = ("quantity", "formula", "value")
        body = [
            (r.quantity, r.formula, r.value_text() + (f"  ({r.note})" if r.note else "")) for r in self.rows
        ]
        w0 = max(len(head[0]), *(len(b[0]) for b in body))
        w1 = min(90, max(len(head[1]), *(len(b[1]) for b in body)))
        lines = [f"{head[0]:<{w0}}  {head[1]:<{w1}}  {head[2]}", f"{'-' * w0}  {'-' * w1}  {'-' * 20}"]
        lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in body]
        return "\n".join(lines)


def _flag(key: str, value: Any) -> str:
    if value is True:
        return f" {key}"
    if value is False or value is None:
        return ""
    return f" {key} {value}"


def vllm_block_size(shape: ModelShape, opts: EngineOptions = EngineOptions()) -> tuple[int, int, str]:
    """(block size, padded state page bytes per layer, explanation) as vLLM's hybrid manager sets them.

    Dense: the backend default (16). Hybrid: all layers share one page size, so an attention page
    (block_size tokens x one layer's KV per token) must hold one layer's state:
    block = align x ceil(state_per_layer / (align x kv_per_layer)); the state page is padded to
    block x kv_per_layer. With --mamba-cache-mode align the state is cached only at multiples of the
    block size, so prefix hits, and the recompute tail, come in blocks of this size.
    """
    if not shape.is_hybrid:
        bs = opts.block_size or opts.dense_block_size
        return bs, 0, f"dense model: backend default block size {bs}"
    if shape.attention_layers == 0 or shape.kv_bytes_per_token_layer == 0:
        page = shape.max_state_bytes_per_layer
        return opts.block_size or opts.dense_block_size, page, "no attention layers: one state page per layer"
    a = opts.kernel_block_alignment
    per_tok = shape.kv_bytes_per_token_layer
    state = shape.max_state_bytes_per_layer
    bs = a * math.ceil(state / (a * per_tok))
    why = f"{a} x ceil({state:,} B state per layer / ({a} x {per_tok:,} B KV per token per layer)) = {bs}"
    if opts.block_size is not None:
        if opts.block_size < bs:
            why += f"; the requested {opts.block_size} is too small, vLLM raises it to {bs}"
        else:
            bs = opts.block_size
            why += f"; requested {bs}"
    return bs, bs * per_tok, why


def _running_max(n: int, env_fraction: float) -> int:
    """p99 of the number of N admitted samples at the engine at once (Binomial(N, 1 - f), normal approx)."""
    if n <= 0:
        return 0
    p = 1 - env_fraction
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return min(n, max(1, math.ceil(mean + 2.326 * sd)))


@dataclass(frozen=True)
class _Demand:
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


def _largest(fits: Callable[[int], bool], hi: int = 1 << 22) -> int:
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


def _busy_batch(
    shape: ModelShape, hw: Hardware, context: float, opts: EngineOptions
) -> tuple[int, str, Callable[[float], float]]:
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
    b = _largest(lambda n: n / step(n) < target, hi=1 << 20) + 1
    return b, how, step


def _overflow(mean: float, sd: float, cap: float) -> float:
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


def _recompute_at(
    n: int,
    dem: _Demand,
    cap: float,
    f: float,
    tail: float,
    mean_ctx: float,
    env_durations: Sequence[float] | None = None,
) -> dict[str, float]:
    m = _running_max(n, f)
    mean, sd = dem.mean_bytes(n, m), dem.sd_bytes(n)
    over = _overflow(mean, sd, cap)
    per_sample = dem.tokens_per_sample * dem.kv + dem.s_pad
    waiting = f * n * per_sample
    running = (1 - f) * n * (per_sample + (dem.states_per_running - 1) * dem.s_pad)
    evict = 1.0 if over > 0 and waiting <= 0 else (min(1.0, over / waiting) if waiting > 0 else 0.0)
    hit = returning_evicted(evict, env_durations)
    recomputed = hit * (mean_ctx - dem.prefix) + tail
    return {
        "concurrency": n,
        "demand_gib": mean / GIB,
        "evicted_fraction": evict,
        "returning_evicted": hit,
        "recompute_tokens_per_step": recomputed,
        "recompute_ratio": recomputed / mean_ctx,
        "running_overflows": float(running + dem.groups * dem.prefix * dem.kv > cap),
    }


@dataclass(frozen=True)
class _Goodput:
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


def _goodput_pick(
    n_fit: int,
    n_busy: int,
    goodput: _Goodput,
    recompute: Callable[[int], float],
    running_ok: Callable[[int], bool],
    tolerance: float,
) -> tuple[int, float, float]:
    """Smallest N in [n_fit, n_busy] within `tolerance` of the best predicted goodput.

    Returns (N, its goodput, the best goodput). Beyond N_fit every extra sample adds batch but makes
    returning samples recompute; where recompute is cheap against decode (a short prefill of an
    evicted context vs. many decode iterations) the best N lies past N_fit.
    """
    if n_busy <= n_fit:
        return n_busy, goodput(n_busy, recompute(n_busy)), goodput(n_busy, recompute(n_busy))
    stride = max(1, (n_busy - n_fit) // 500)
    grid = list(range(n_fit, n_busy + 1, stride))
    values: list[tuple[int, float]] = []
    for n in grid:
        if n > n_fit and not running_ok(n):
            break
        values.append((n, goodput(n, recompute(n))))
    best = max(g for _, g in values)
    n = next(n for n, g in values if g >= (1 - tolerance) * best)
    return n, dict(values)[n], best


def plan(
    shape: ModelShape,
    hardware: Hardware,
    workload: Workload,
    options: EngineOptions = EngineOptions(),
    *,
    curve_points: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0),
) -> Plan:
    """Compute the memory split, reference concurrency, recompute and engine settings (see module doc)."""
    hw, wl, opts = hardware, workload, options
    rows: list[Row] = []
    add = rows.append
    f = wl.env_fraction
    usable = hw.gpu_mem_bytes * hw.gpu_util
    cache = usable - shape.weights_bytes - hw.reserve_bytes
    add(
        Row(
            "GPU memory usable",
            "gpu_mem x gpu_util",
            usable,
            "B",
            f"{hw.gpu_util:g} of {format_value(hw.gpu_mem_bytes, 'B')}",
        )
    )
    add(Row("weights", shape.weights_source, shape.weights_bytes, "B"))
    add(
        Row(
            "activation / overhead reserve",
            "given",
            hw.reserve_bytes,
            "B",
            "activations, CUDA graphs, non-torch",
        )
    )
    add(Row("memory for caches C", "usable - weights - reserve", cache, "B"))
    if cache <= 0:
        raise PlanError(
            f"no memory left for caches: {format_value(usable, 'B')} usable - weights "
            f"{format_value(shape.weights_bytes, 'B')} - reserve {format_value(hw.reserve_bytes, 'B')} <= 0; "
            "use a bigger GPU, a higher --gpu-util, quantised weights or tensor parallelism"
        )
    kv = shape.kv_bytes_per_token
    add(Row("attention layers", f"of {shape.num_layers} layers", shape.attention_layers, "layers"))
    add(Row("KV bytes per token per layer", shape.kv_formula, shape.kv_bytes_per_token_layer, "B"))
    add(Row("KV bytes per token kv", "attention_layers x per-layer", kv, "B"))
    for g in shape.state_layers:
        add(Row(f"state per {g.kind} layer", g.formula, g.bytes_per_layer, "B", f"{g.count} layers"))
    s = shape.state_bytes_per_seq
    if shape.is_hybrid:
        add(Row("state bytes per sequence s", "sum over recurrent layers", s, "B"))
        add(Row("state in KV tokens (token_equiv)", "s / kv", shape.token_equiv, "tokens"))
    if kv == 0:
        raise PlanError(
            "model has no attention layers: the KV/state split does not apply (pure recurrent model)"
        )

    bs, page, why_bs = vllm_block_size(shape, opts)
    s_pad = shape.state_layer_count * page if shape.is_hybrid else 0
    add(Row("block size", why_bs, bs, "tokens"))
    if shape.is_hybrid:
        add(
            Row(
                "state bytes as stored s_pad",
                "recurrent layers x padded page (block x kv per layer)",
                s_pad,
                "B",
                f"padding {100 * (s_pad - s) / s:.1f} %" if s else "",
            )
        )

    mu, sigma, prefix = wl.mean_context, wl.std_context, wl.shared_prefix
    add(Row("mean context mu", wl.source, mu, "tokens", f"sd {sigma:,.0f}, p95 {wl.quantile(0.95):,.0f}"))
    add(Row("env fraction f", "time waiting on the environment / sample life", f, "ratio"))
    add(Row("shared prefix P", "stored once for all samples", prefix, "tokens"))
    dem = _Demand(
        kv,
        s_pad,
        mu - prefix + bs / 2,
        sigma,
        prefix,
        shape.is_hybrid,
        opts.states_per_running,
        wl.prefix_groups,
    )
    add(
        Row(
            "bytes per cached sample",
            "(mu - P + block/2) x kv + s_pad",
            dem.tokens_per_sample * kv + s_pad,
            "B",
        )
    )

    def fits(n: int) -> bool:
        m = _running_max(n, f)
        return dem.mean_bytes(n, m) + opts.safety_z * dem.sd_bytes(n) <= cache

    n_mem = _largest(fits)
    add(
        Row(
            "N_mem (all admitted cached)",
            f"max N: N x per-sample + M x {opts.states_per_running - 1} x s_pad + P x kv + {opts.safety_z:g} sqrt(N) sd x kv <= C",
            n_mem,
            "samples",
            "M = p99 running of N",
        )
    )
    if n_mem == 0:
        raise PlanError("not even one sample fits cached: C is smaller than one sample's KV + state")

    b_busy, how, step = _busy_batch(shape, hw, mu, opts)
    if opts.target_running is not None:
        b_busy, how = opts.target_running, "given (--target-running)"
    add(
        Row(
            "B_busy (running batch for busy GPU)",
            how,
            b_busy,
            "seqs",
            f"{opts.busy_fraction:g} of asymptotic decode tokens/s",
        )
    )
    n_busy = math.ceil(b_busy / (1 - f))
    add(Row("N_busy", "ceil(B_busy / (1 - f))", n_busy, "samples"))
    tail = bs / 2
    n_good: int | None = None
    candidates = {"memory": n_mem, "busy": n_busy}
    n_cap = min(n_busy, wl.num_samples or n_busy)
    if opts.allow_recompute and n_cap > n_mem and wl.output_tokens and wl.new_tokens is not None:
        prefill_s = opts.cost.c_prefill if opts.cost else 2 * shape.active_params / hw.peak_flops
        gp = _Goodput(step, prefill_s, wl.output_tokens, wl.new_tokens, f, float("inf"))
        n_good, g_at, g_best = _goodput_pick(
            n_mem,
            n_cap,
            gp,
            lambda n: _recompute_at(n, dem, cache, f, tail, mu, wl.env_durations)[
                "recompute_tokens_per_step"
            ],
            lambda n: not _recompute_at(n, dem, cache, f, tail, mu, wl.env_durations)["running_overflows"],
            opts.goodput_tolerance,
        )
        add(
            Row(
                "N_goodput (recompute allowed)",
                f"smallest N in [N_mem, N_busy] within {opts.goodput_tolerance:.0%} of max R/(t_decode(R) + "
                "t_prefill x R x (new + recompute(N)) / out)",
                n_good,
                "samples",
                f"{g_at:,.0f} vs N_mem {gp(n_mem, tail):,.0f} tokens/s predicted",
            )
        )
        if n_good > n_mem:
            candidates = {"goodput": n_good, "busy": n_busy}
    if wl.num_samples:
        candidates["batch"] = wl.num_samples
    binding = min(candidates, key=lambda k: candidates[k])
    n_ref = candidates[binding]
    add(
        Row(
            "reference concurrency N_ref",
            "min("
            + ", ".join(
                {"memory": "N_mem", "goodput": "N_goodput", "busy": "N_busy", "batch": "batch"}[k]
                for k in candidates
            )
            + ")",
            n_ref,
            "samples",
            f"bound by {binding}",
        )
    )
    m_ref = _running_max(n_ref, f)
    add(Row("max running M (max-num-seqs)", "p99 of Binomial(N_ref, 1 - f)", m_ref, "seqs"))

    state_copies = n_ref + m_ref * (opts.states_per_running - 1) + (1 if shape.is_hybrid and prefix else 0)
    state_pool = state_copies * s_pad if shape.is_hybrid else 0
    kv_pool = int(cache - state_pool)
    if shape.is_hybrid:
        add(
            Row(
                "state copies at N_ref",
                f"N_ref + M x {opts.states_per_running - 1} (+1 shared prefix)",
                state_copies,
                "slots",
            )
        )
        add(Row("state pool", "copies x s_pad", state_pool, "B", f"{100 * state_pool / cache:.1f} % of C"))
    add(Row("KV pool", "C - state pool", kv_pool, "B", f"{kv_pool / kv:,.0f} tokens"))

    at = _recompute_at(n_ref, dem, cache, f, tail, mu, wl.env_durations)
    add(
        Row(
            "evicted fraction at N_ref",
            "E[max(0, demand - C)] / bytes of waiting samples",
            at["evicted_fraction"],
            "ratio",
        )
    )
    add(
        Row(
            "returns finding their cache evicted",
            "P(W > tau), E[(W - tau)+] / E[W] = evicted (LRU by age; = evicted without env durations)",
            at["returning_evicted"],
            "ratio",
        )
    )
    add(
        Row(
            "recompute per inference step",
            "returns evicted x (mu - P) + block/2 (aligned-prefix tail)",
            at["recompute_tokens_per_step"],
            "tokens/step",
        )
    )
    add(Row("recompute rate", "recompute / mu", 100 * at["recompute_ratio"], "%"))

    grid = sorted({max(1, round(n_ref * x)) for x in curve_points} | {n_mem, n_busy})
    curve = [_recompute_at(n, dem, cache, f, tail, mu, wl.env_durations) for n in grid]

    max_len = wl.peak_context or math.ceil(wl.quantile(0.99) * 1.25)
    max_len = bs * math.ceil(max_len / bs)
    notes: list[str] = []
    if shape.max_context and max_len > shape.max_context:
        notes.append(
            f"peak context {max_len} exceeds the model's max_position_embeddings {shape.max_context}"
        )
        max_len = shape.max_context
    mnbt = bs * math.ceil(max(opts.max_num_batched_tokens, bs) / bs)
    vllm: dict[str, Any] = {
        "--gpu-memory-utilization": hw.gpu_util,
        "--max-num-seqs": m_ref,
        "--block-size": bs,
        "--enable-prefix-caching": True,
        "--max-num-batched-tokens": mnbt,
        "--max-model-len": max_len,
        "--scheduling-policy": "priority",
    }
    if shape.is_hybrid:
        vllm["--mamba-cache-mode"] = "align"
        if shape.state_dtype and shape.state_dtype != shape.model_dtype:
            vllm["--mamba-ssm-cache-dtype"] = shape.state_dtype

    S, D = opts.sglang_slots_per_running, opts.sglang_draft_tokens
    comparison: list[str] = []
    sglang: dict[str, Any] = {"--mem-fraction-static": hw.gpu_util, "--max-running-requests": m_ref}
    if shape.is_hybrid:
        # SGLang keeps two pools and S+D state slots per running request: its own N differs from vLLM's.
        sg = _Demand(kv, s, mu - prefix, sigma, prefix, True, 1 + S + D, wl.prefix_groups)

        def fits_sg(n: int) -> bool:
            return sg.mean_bytes(n, _running_max(n, f)) + opts.safety_z * sg.sd_bytes(n) <= cache

        n_sg = min(_largest(fits_sg), n_busy, wl.num_samples or n_busy)
        m_sg = _running_max(n_sg, f)
        slots = n_sg + m_sg * (S + D) + (1 if prefix else 0)
        sg_state = slots * s
        ratio = sg_state / (cache - sg_state) if cache > sg_state else float("inf")
        r_star = (S + D) * shape.token_equiv / mu
        sglang.update(
            {
                "--max-running-requests": m_sg,
                "--max-mamba-cache-size": slots,
                "--mamba-full-memory-ratio": round(ratio, 4) if math.isfinite(ratio) else None,
            }
        )
        add(
            Row(
                "SGLang concurrency",
                f"as N_mem with S+D = {S}+{D} state slots per running request",
                n_sg,
                "samples",
            )
        )
        add(Row("SGLang state slots", "N + M x (S + D) (+1 prefix)", slots, "slots", f"M = {m_sg}"))
        add(Row("SGLang ratio (ours)", "slots x s / (C - slots x s)", ratio, "ratio"))
        add(Row("SGLang balance point r*", "(S + D) x token_equiv / mu", r_star, "ratio"))
        n_at_rstar = _fits_split(cache, r_star, s, kv, sg, f, S + D, opts.safety_z)
        add(
            Row(
                "samples cached at r*",
                "max N: N + M(S+D) slots and N(mu-P)+P tokens fit the r* pools",
                n_at_rstar,
                "samples",
            )
        )
        per_slots = 1 + m_sg / max(1, n_sg) * (S + D)
        per_tokens = mu - prefix + prefix / max(1, n_sg)
        comparison += [
            f"SGLang's balance point r* = (S+D) x token_equiv / mu = ({S}+{D}) x {shape.token_equiv:,.0f} / "
            f"{mu:,.0f} = {r_star:.3f}; ours = {ratio:.3f}.",
            f"r* prices every request as running: {S + D} state slots and mu = {mu:,.0f} KV tokens each. "
            f"An admitted agent sample runs only a fraction 1 - f = {1 - f:g} of its life (M = {m_sg} of "
            f"N = {n_sg} at the p99); while it waits in the environment it keeps one checkpoint slot and its KV: "
            f"1 + (M/N)(S+D) = {per_slots:.2f} slots per admitted sample, not {S + D}.",
            f"The shared prefix ({prefix:,} tokens) is one KV copy for all samples: mu - P + P/N = "
            f"{per_tokens:,.0f} tokens per sample, not {mu:,.0f}.",
            f"Per sample: ours {per_slots:.2f} slots : {per_tokens:,.0f} tokens vs r*'s {S + D} : {mu:,.0f}. At r* the "
            f"pools hold {n_at_rstar} samples without eviction; at our ratio {n_sg}.",
            f"vLLM keeps one pool (no split to choose): there the model sets --max-num-seqs, the block size "
            f"and the admission limit N_ref = {n_ref}.",
        ]
    else:
        comparison.append("dense model: one KV pool, no state pool; SGLang's mamba settings do not apply.")
    if binding == "memory" and n_busy > n_mem:
        notes.append(
            f"memory-bound: keeping the GPU busy needs {n_busy} samples but only {n_mem} fit cached; "
            "admitting more trades recompute for batch size (see the recompute curve)"
        )
    if binding == "busy":
        notes.append(f"compute-bound: {n_busy} samples keep the GPU busy; memory would hold {n_mem}")

    return Plan(
        model=shape.name,
        hybrid=shape.is_hybrid,
        cache_bytes=int(cache),
        kv_bytes_per_token=kv,
        state_bytes_per_seq=s,
        block_size=bs,
        n_mem=n_mem,
        n_busy=n_busy,
        reference_concurrency=n_ref,
        binding=binding,
        max_num_seqs=m_ref,
        kv_pool_bytes=kv_pool,
        state_pool_bytes=int(state_pool),
        recompute_tokens_per_step=at["recompute_tokens_per_step"],
        recompute_ratio=at["recompute_ratio"],
        n_goodput=n_good,
        rows=rows,
        vllm_args=vllm,
        sglang_args=sglang,
        comparison=comparison,
        recompute_curve=curve,
        notes=notes,
    )


def _fits_split(
    cache: float, r: float, s: int, kv: int, dem: _Demand, f: float, slots_per_running: int, z: float
) -> int:
    """Samples SGLang's two pools, split at ratio r, hold cached (no eviction)."""
    state_slots = cache * r / (1 + r) / s
    kv_tokens = cache / (1 + r) / kv

    def fits(n: int) -> bool:
        m = _running_max(n, f)
        tokens = n * (dem.tokens_per_sample) + dem.prefix + z * math.sqrt(n) * dem.sd_tokens
        return n + m * slots_per_running <= state_slots and tokens <= kv_tokens

    return _largest(fits)


def reference_concurrency(
    *,
    kv_capacity_tokens: int,
    block_size: int,
    workload: Workload,
    checkpoint_slots: int | None = None,
    max_running: int | None = None,
    target_running: int | None = None,
    cost: LinearCost | None = None,
    busy_fraction: float = 0.9,
    safety_z: float = 1.645,
    allow_recompute: bool = True,
    goodput_tolerance: float = 0.02,
) -> tuple[int, dict[str, float]]:
    """N_ref for an engine described by its pool capacities (e.g. a simulated EngineProfile).

    Two pools, as the simulated engine and SGLang keep them: `kv_capacity_tokens` of paged KV and,
    for hybrid models, `checkpoint_slots` saved recurrent states (None = dense). A cached sample
    holds (context - prefix + block/2) KV tokens and one checkpoint; `max_running` caps the running
    batch (max-num-seqs, or the state slots). B_busy comes from `cost` (or `target_running`); with
    `allow_recompute` and the workload's output/new tokens per step, N may pass N_mem where the
    predicted goodput says so (see `_goodput_pick`). Returns (N_ref, the bounds).
    """
    wl = workload
    f = wl.env_fraction
    mu, sigma, prefix, groups = wl.mean_context, wl.std_context, wl.shared_prefix, wl.prefix_groups
    per = mu - prefix + block_size / 2
    cap_run = float(max_running) if max_running else float("inf")

    def kv_tokens(n: int) -> float:
        return n * per + groups * prefix

    def fits(n: int) -> bool:
        if kv_tokens(n) + safety_z * math.sqrt(n) * sigma > kv_capacity_tokens:
            return False
        return checkpoint_slots is None or n + (groups if prefix else 0) <= checkpoint_slots

    def evicted(n: int) -> float:
        over = _overflow(kv_tokens(n), math.sqrt(n) * sigma, kv_capacity_tokens)
        waiting = f * n * per
        e = min(1.0, over / waiting) if waiting > 0 else float(over > 0)
        if checkpoint_slots is not None:
            excess = max(0.0, n + (groups if prefix else 0) - checkpoint_slots)
            e = max(e, min(1.0, excess / (f * n)) if f > 0 else float(excess > 0))
        return e

    def running_ok(n: int) -> bool:
        return min((1 - f) * n, cap_run) * per + groups * prefix <= kv_capacity_tokens

    n_mem = _largest(fits)
    if cost is None and target_running is None:
        raise PlanError("reference_concurrency needs a cost model or target_running for B_busy")
    if target_running is not None:
        b_busy = target_running
    else:
        assert cost is not None
        asym = 1.0 / (cost.c_decode + cost.c_attn * mu)
        b_busy = _largest(lambda n: n / cost.decode_step(n, mu) < busy_fraction * asym, hi=1 << 20) + 1
    b_busy = int(min(b_busy, cap_run))
    n_busy = math.ceil(b_busy / (1 - f))
    n_cap = min(n_busy, wl.num_samples or n_busy)
    bounds: dict[str, float] = {"n_mem": n_mem, "n_busy": n_busy, "b_busy": b_busy}
    n_ref = min(n_mem, n_cap)
    if (
        allow_recompute
        and cost is not None
        and n_cap > n_mem
        and wl.output_tokens
        and wl.new_tokens is not None
    ):
        c = cost
        gp = _Goodput(
            lambda r: c.decode_step(r, mu), c.c_prefill, wl.output_tokens, wl.new_tokens, f, cap_run
        )
        tail = block_size / 2
        n_good, g_at, g_best = _goodput_pick(
            n_mem,
            n_cap,
            gp,
            lambda n: returning_evicted(evicted(n), wl.env_durations) * (mu - prefix) + tail,
            running_ok,
            goodput_tolerance,
        )
        bounds.update(
            n_goodput=n_good, goodput_tok_s=g_at, goodput_best_tok_s=g_best, goodput_at_n_mem=gp(n_mem, tail)
        )
        n_ref = max(n_ref, n_good)
    return max(1, n_ref), bounds
