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

The library is split by concern: `inputs` (GPU, engine options), `workload` (and
`workload_sources`: trace, CSV, statistics), `model_shape` (and `presets`), `demand` (the memory
and throughput arithmetic), `reference` (N_ref from pool capacities, e.g. a simulated profile),
`sglang` (SGLang's pools and r*), and this module, the plan itself. Pure: stdlib + numpy, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentbatch.planning.demand import (
    Demand,
    Goodput,
    RecomputePoint,
    busy_batch,
    goodput_pick,
    largest,
    recompute_at,
    returning_evicted,
    running_max,
)
from agentbatch.planning.errors import PlanError
from agentbatch.planning.inputs import GIB, EngineOptions, Hardware, LinearCost
from agentbatch.planning.model_shape import ConfigError, ModelShape, StateLayers, shape_from_config
from agentbatch.planning.reference import ConcurrencyPick, reference_concurrency
from agentbatch.planning.sglang import sglang_settings
from agentbatch.planning.workload import Workload

DEFAULT_OPTIONS = EngineOptions()

__all__ = [
    "GIB",
    "BlockLayout",
    "ConcurrencyPick",
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
    recompute_curve: list[RecomputePoint] = field(default_factory=list)
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


@dataclass(frozen=True)
class BlockLayout:
    block_size: int  # tokens per KV block
    state_page_bytes: int  # padded state page per recurrent layer (0 for dense models)
    why: str  # how it was derived, for the reasoning table


def vllm_block_size(shape: ModelShape, opts: EngineOptions = DEFAULT_OPTIONS) -> BlockLayout:
    """Block size and padded state page bytes per layer, as vLLM's hybrid manager sets them.

    Dense: the backend default (16). Hybrid: all layers share one page size, so an attention page
    (block_size tokens x one layer's KV per token) must hold one layer's state:
    block = align x ceil(state_per_layer / (align x kv_per_layer)); the state page is padded to
    block x kv_per_layer. With --mamba-cache-mode align the state is cached only at multiples of the
    block size, so prefix hits, and the recompute tail, come in blocks of this size.
    """
    if not shape.is_hybrid:
        bs = opts.block_size or opts.dense_block_size
        return BlockLayout(bs, 0, f"dense model: backend default block size {bs}")
    if shape.attention_layers == 0 or shape.kv_bytes_per_token_layer == 0:
        page = shape.max_state_bytes_per_layer
        return BlockLayout(opts.block_size or opts.dense_block_size, page, "no attention layers: one state page per layer")
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
    return BlockLayout(bs, bs * per_tok, why)


class _Rows(list[Row]):
    """The reasoning table being built."""

    def add(self, quantity: str, formula: str, value: float, unit: str, note: str = "") -> None:
        self.append(Row(quantity, formula, value, unit, note))


@dataclass(frozen=True)
class _Memory:
    """Step 1: the bytes the caches get and what a token / a sequence costs in them."""

    cache: float  # C
    kv: int  # KV bytes per token
    s: int  # state bytes per sequence (unpadded)
    layout: BlockLayout
    s_pad: int  # state bytes per sequence as stored

    @property
    def bs(self) -> int:
        return self.layout.block_size


def _cache_bytes(shape: ModelShape, hw: Hardware, rows: _Rows) -> float:
    usable = hw.gpu_mem_bytes * hw.gpu_util
    cache = usable - shape.weights_bytes - hw.reserve_bytes
    rows.add("GPU memory usable", "gpu_mem x gpu_util", usable, "B",
             f"{hw.gpu_util:g} of {format_value(hw.gpu_mem_bytes, 'B')}")  # fmt: skip
    rows.add("weights", shape.weights_source, shape.weights_bytes, "B")
    rows.add("activation / overhead reserve", "given", hw.reserve_bytes, "B", "activations, CUDA graphs, non-torch")
    rows.add("memory for caches C", "usable - weights - reserve", cache, "B")
    if cache <= 0:
        raise PlanError(
            f"no memory left for caches: {format_value(usable, 'B')} usable - weights "
            f"{format_value(shape.weights_bytes, 'B')} - reserve {format_value(hw.reserve_bytes, 'B')} <= 0; "
            "use a bigger GPU, a higher --gpu-util, quantised weights or tensor parallelism"
        )
    return cache


def _memory(shape: ModelShape, hw: Hardware, opts: EngineOptions, rows: _Rows) -> _Memory:
    cache = _cache_bytes(shape, hw, rows)
    kv = shape.kv_bytes_per_token
    rows.add("attention layers", f"of {shape.num_layers} layers", shape.attention_layers, "layers")
    rows.add("KV bytes per token per layer", shape.kv_formula, shape.kv_bytes_per_token_layer, "B")
    rows.add("KV bytes per token kv", "attention_layers x per-layer", kv, "B")
    for g in shape.state_layers:
        rows.add(f"state per {g.kind} layer", g.formula, g.bytes_per_layer, "B", f"{g.count} layers")
    s = shape.state_bytes_per_seq
    if shape.is_hybrid:
        rows.add("state bytes per sequence s", "sum over recurrent layers", s, "B")
        rows.add("state in KV tokens (token_equiv)", "s / kv", shape.token_equiv, "tokens")
    if kv == 0:
        raise PlanError("model has no attention layers: the KV/state split does not apply (pure recurrent model)")
    layout = vllm_block_size(shape, opts)
    s_pad = shape.state_layer_count * layout.state_page_bytes if shape.is_hybrid else 0
    rows.add("block size", layout.why, layout.block_size, "tokens")
    if shape.is_hybrid:
        rows.add("state bytes as stored s_pad", "recurrent layers x padded page (block x kv per layer)", s_pad,
                 "B", f"padding {100 * (s_pad - s) / s:.1f} %" if s else "")  # fmt: skip
    return _Memory(cache, kv, s, layout, s_pad)


def _demand(shape: ModelShape, wl: Workload, opts: EngineOptions, mem: _Memory, rows: _Rows) -> Demand:
    """Step 2: what an admitted sample holds."""
    mu, sigma, prefix = wl.mean_context, wl.std_context, wl.shared_prefix
    rows.add("mean context mu", wl.source, mu, "tokens", f"sd {sigma:,.0f}, p95 {wl.quantile(0.95):,.0f}")
    rows.add("env fraction f", "time waiting on the environment / sample life", wl.env_fraction, "ratio")
    rows.add("shared prefix P", "stored once for all samples", prefix, "tokens")
    dem = Demand(mem.kv, mem.s_pad, mu - prefix + mem.bs / 2, sigma, prefix, shape.is_hybrid,
                 opts.states_per_running, wl.prefix_groups)  # fmt: skip
    rows.add("bytes per cached sample", "(mu - P + block/2) x kv + s_pad", dem.tokens_per_sample * mem.kv + mem.s_pad,
             "B")  # fmt: skip
    return dem


@dataclass(frozen=True)
class _Pick:
    """Steps 3-5: the bounds on concurrency and the one that binds."""

    n_mem: int
    n_busy: int
    n_goodput: int | None
    binding: str  # "memory" | "goodput" | "busy" | "batch"
    n_ref: int
    m_ref: int  # p99 running at N_ref (max-num-seqs)


@dataclass(frozen=True)
class _Context:
    """Everything the concurrency steps read."""

    shape: ModelShape
    hw: Hardware
    wl: Workload
    opts: EngineOptions
    mem: _Memory
    dem: Demand

    def recompute(self, n: int) -> RecomputePoint:
        wl = self.wl
        return recompute_at(n, self.dem, self.mem.cache, wl.env_fraction, self.mem.bs / 2, wl.mean_context,
                            wl.env_durations)  # fmt: skip


def _n_mem(c: _Context, rows: _Rows) -> int:
    f, dem, opts = c.wl.env_fraction, c.dem, c.opts

    def fits(n: int) -> bool:
        m = running_max(n, f)
        return dem.mean_bytes(n, m) + opts.safety_z * dem.sd_bytes(n) <= c.mem.cache

    n_mem = largest(fits)
    rows.add(
        "N_mem (all admitted cached)",
        f"max N: N x per-sample + M x {opts.states_per_running - 1} x s_pad + P x kv + {opts.safety_z:g} sqrt(N) sd x kv <= C",
        n_mem,
        "samples",
        "M = p99 running of N",
    )
    if n_mem == 0:
        raise PlanError("not even one sample fits cached: C is smaller than one sample's KV + state")
    return n_mem


@dataclass(frozen=True)
class _BusyBound:
    step: Callable[[float], float]  # decode step time at running batch B (for the goodput pick)
    n_busy: int


def _busy(c: _Context, rows: _Rows) -> _BusyBound:
    busy = busy_batch(c.shape, c.hw, c.wl.mean_context, c.opts)
    b_busy, how = busy.batch, busy.how
    if c.opts.target_running is not None:
        b_busy, how = c.opts.target_running, "given (--target-running)"
    rows.add("B_busy (running batch for busy GPU)", how, b_busy, "seqs",
             f"{c.opts.busy_fraction:g} of asymptotic decode tokens/s")  # fmt: skip
    n_busy = math.ceil(b_busy / (1 - c.wl.env_fraction))
    rows.add("N_busy", "ceil(B_busy / (1 - f))", n_busy, "samples")
    return _BusyBound(busy.step, n_busy)


def _n_goodput(c: _Context, busy: _BusyBound, n_mem: int, rows: _Rows) -> int | None:
    """Step 5: past N_mem where the predicted goodput says so (None when it does not apply)."""
    wl, opts, n_busy = c.wl, c.opts, busy.n_busy
    n_cap = min(n_busy, wl.num_samples or n_busy)
    if not (opts.allow_recompute and n_cap > n_mem and wl.output_tokens and wl.new_tokens is not None):
        return None
    prefill_s = opts.cost.c_prefill if opts.cost else 2 * c.shape.active_params / c.hw.peak_flops
    gp = Goodput(busy.step, prefill_s, wl.output_tokens, wl.new_tokens, wl.env_fraction, float("inf"))
    pick = goodput_pick(
        n_mem,
        n_cap,
        gp,
        lambda n: c.recompute(n).recompute_tokens_per_step,
        lambda n: not c.recompute(n).running_overflows,
        opts.goodput_tolerance,
    )
    rows.add(
        "N_goodput (recompute allowed)",
        f"smallest N in [N_mem, N_busy] within {opts.goodput_tolerance:.0%} of max R/(t_decode(R) + "
        "t_prefill x R x (new + recompute(N)) / out)",
        pick.n,
        "samples",
        f"{pick.goodput:,.0f} vs N_mem {gp(n_mem, c.mem.bs / 2):,.0f} tokens/s predicted",
    )
    return pick.n


_BOUND_NAMES = {"memory": "N_mem", "goodput": "N_goodput", "busy": "N_busy", "batch": "batch"}


def _pick(c: _Context, rows: _Rows) -> _Pick:
    n_mem = _n_mem(c, rows)
    busy = _busy(c, rows)
    n_busy = busy.n_busy
    n_good = _n_goodput(c, busy, n_mem, rows)
    candidates = {"memory": n_mem, "busy": n_busy}
    if n_good is not None and n_good > n_mem:
        candidates = {"goodput": n_good, "busy": n_busy}
    if c.wl.num_samples:
        candidates["batch"] = c.wl.num_samples
    binding = min(candidates, key=lambda k: candidates[k])
    n_ref = candidates[binding]
    rows.add("reference concurrency N_ref", "min(" + ", ".join(_BOUND_NAMES[k] for k in candidates) + ")", n_ref,
             "samples", f"bound by {binding}")  # fmt: skip
    m_ref = running_max(n_ref, c.wl.env_fraction)
    rows.add("max running M (max-num-seqs)", "p99 of Binomial(N_ref, 1 - f)", m_ref, "seqs")
    return _Pick(n_mem, n_busy, n_good, binding, n_ref, m_ref)


@dataclass(frozen=True)
class _Pools:
    kv_pool: int
    state_pool: int


def _pools(c: _Context, p: _Pick, rows: _Rows) -> _Pools:
    shape, opts, mem = c.shape, c.opts, c.mem
    extra = 1 if shape.is_hybrid and c.wl.shared_prefix else 0
    state_copies = p.n_ref + p.m_ref * (opts.states_per_running - 1) + extra
    state_pool = state_copies * mem.s_pad if shape.is_hybrid else 0
    kv_pool = int(mem.cache - state_pool)
    if shape.is_hybrid:
        rows.add("state copies at N_ref", f"N_ref + M x {opts.states_per_running - 1} (+1 shared prefix)",
                 state_copies, "slots")  # fmt: skip
        rows.add("state pool", "copies x s_pad", state_pool, "B", f"{100 * state_pool / mem.cache:.1f} % of C")
    rows.add("KV pool", "C - state pool", kv_pool, "B", f"{kv_pool / mem.kv:,.0f} tokens")
    return _Pools(kv_pool, int(state_pool))


def _recompute_rows(at: RecomputePoint, rows: _Rows) -> None:
    rows.add("evicted fraction at N_ref", "E[max(0, demand - C)] / bytes of waiting samples", at.evicted_fraction,
             "ratio")  # fmt: skip
    rows.add(
        "returns finding their cache evicted",
        "P(W > tau), E[(W - tau)+] / E[W] = evicted (LRU by age; = evicted without env durations)",
        at.returning_evicted,
        "ratio",
    )
    rows.add("recompute per inference step", "returns evicted x (mu - P) + block/2 (aligned-prefix tail)",
             at.recompute_tokens_per_step, "tokens/step")  # fmt: skip
    rows.add("recompute rate", "recompute / mu", 100 * at.recompute_ratio, "%")


def _vllm_args(c: _Context, m_ref: int, notes: list[str]) -> dict[str, Any]:
    shape, wl, bs = c.shape, c.wl, c.mem.bs
    max_len = wl.peak_context or math.ceil(wl.quantile(0.99) * 1.25)
    max_len = bs * math.ceil(max_len / bs)
    if shape.max_context and max_len > shape.max_context:
        notes.append(f"peak context {max_len} exceeds the model's max_position_embeddings {shape.max_context}")
        max_len = shape.max_context
    vllm: dict[str, Any] = {
        "--gpu-memory-utilization": c.hw.gpu_util,
        "--max-num-seqs": m_ref,
        "--block-size": bs,
        "--enable-prefix-caching": True,
        "--max-num-batched-tokens": bs * math.ceil(max(c.opts.max_num_batched_tokens, bs) / bs),
        "--max-model-len": max_len,
        "--scheduling-policy": "priority",
    }
    if shape.is_hybrid:
        vllm["--mamba-cache-mode"] = "align"
        if shape.state_dtype and shape.state_dtype != shape.model_dtype:
            vllm["--mamba-ssm-cache-dtype"] = shape.state_dtype
    return vllm


def _binding_notes(p: _Pick) -> list[str]:
    if p.binding == "memory" and p.n_busy > p.n_mem:
        return [
            f"memory-bound: keeping the GPU busy needs {p.n_busy} samples but only {p.n_mem} fit cached; "
            "admitting more trades recompute for batch size (see the recompute curve)"
        ]
    if p.binding == "busy":
        return [f"compute-bound: {p.n_busy} samples keep the GPU busy; memory would hold {p.n_mem}"]
    return []


def plan(
    shape: ModelShape,
    hardware: Hardware,
    workload: Workload,
    options: EngineOptions = DEFAULT_OPTIONS,
    *,
    curve_points: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0),
) -> Plan:
    """Compute the memory split, reference concurrency, recompute and engine settings (see module doc)."""
    rows = _Rows()
    mem = _memory(shape, hardware, options, rows)
    dem = _demand(shape, workload, options, mem, rows)
    c = _Context(shape, hardware, workload, options, mem, dem)
    p = _pick(c, rows)
    pools = _pools(c, p, rows)
    at = c.recompute(p.n_ref)
    _recompute_rows(at, rows)
    grid = sorted({max(1, round(p.n_ref * x)) for x in curve_points} | {p.n_mem, p.n_busy})
    notes: list[str] = []
    vllm = _vllm_args(c, p.m_ref, notes)
    sglang = sglang_settings(shape, workload, options, gpu_util=hardware.gpu_util, cache=mem.cache,
                             n_busy=p.n_busy, n_ref=p.n_ref, m_ref=p.m_ref, add_row=rows.add)  # fmt: skip
    return Plan(
        model=shape.name,
        hybrid=shape.is_hybrid,
        cache_bytes=int(mem.cache),
        kv_bytes_per_token=mem.kv,
        state_bytes_per_seq=mem.s,
        block_size=mem.bs,
        n_mem=p.n_mem,
        n_busy=p.n_busy,
        reference_concurrency=p.n_ref,
        binding=p.binding,
        max_num_seqs=p.m_ref,
        kv_pool_bytes=pools.kv_pool,
        state_pool_bytes=pools.state_pool,
        recompute_tokens_per_step=at.recompute_tokens_per_step,
        recompute_ratio=at.recompute_ratio,
        n_goodput=p.n_goodput,
        rows=list(rows),
        vllm_args=vllm,
        sglang_args=sglang.args,
        comparison=sglang.comparison,
        recompute_curve=[c.recompute(n) for n in grid],
        notes=notes + _binding_notes(p),
    )
