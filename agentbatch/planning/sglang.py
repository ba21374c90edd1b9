"""SGLang's settings for the same model and workload, and how its balance point compares.

SGLang keeps two pools (KV tokens, state slots) and S + D state slots per running request (S slots
per running request, D draft tokens). Its balance point r* = (S + D) x token_equiv / mu prices every
request as running; an agent batch runs only a fraction 1 - f of its admitted samples and stores
the shared prefix once. This module sizes SGLang's pools for the workload and writes both views.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbatch.planning.demand import Demand, fits_split, largest, running_max
from agentbatch.planning.inputs import EngineOptions
from agentbatch.planning.model_shape import ModelShape
from agentbatch.planning.workload import Workload


@dataclass(frozen=True)
class SGLangFit:
    slots_per_running: int  # S
    draft_tokens: int  # D
    n: int  # samples SGLang's pools hold cached at our split
    m: int  # p99 running of n
    slots: int  # state slots: n + m (S + D) (+1 shared prefix)
    ratio: float  # our --mamba-full-memory-ratio: state bytes / KV bytes
    r_star: float  # SGLang's balance point
    n_at_r_star: int  # samples its pools hold at r*


@dataclass
class SGLangSettings:
    args: dict[str, Any] = field(default_factory=dict)
    comparison: list[str] = field(default_factory=list)


def fit_sglang(
    shape: ModelShape, wl: Workload, opts: EngineOptions, cache: float, n_busy: int
) -> SGLangFit:
    """SGLang's own concurrency and pool split for a hybrid model (its N differs from vLLM's)."""
    S, D = opts.sglang_slots_per_running, opts.sglang_draft_tokens
    f, mu, prefix = wl.env_fraction, wl.mean_context, wl.shared_prefix
    kv, s = shape.kv_bytes_per_token, shape.state_bytes_per_seq
    sg = Demand(kv, s, mu - prefix, wl.std_context, prefix, True, 1 + S + D, wl.prefix_groups)

    def fits_sg(n: int) -> bool:
        return sg.mean_bytes(n, running_max(n, f)) + opts.safety_z * sg.sd_bytes(n) <= cache

    n_sg = min(largest(fits_sg), n_busy, wl.num_samples or n_busy)
    m_sg = running_max(n_sg, f)
    slots = n_sg + m_sg * (S + D) + (1 if prefix else 0)
    sg_state = slots * s
    ratio = sg_state / (cache - sg_state) if cache > sg_state else float("inf")
    r_star = (S + D) * shape.token_equiv / mu
    n_at_r_star = fits_split(cache, r_star, s, kv, sg, f, S + D, opts.safety_z)
    return SGLangFit(S, D, n_sg, m_sg, slots, ratio, r_star, n_at_r_star)


def _comparison(fit: SGLangFit, shape: ModelShape, wl: Workload, n_ref: int) -> list[str]:
    S, D, f, mu, prefix = fit.slots_per_running, fit.draft_tokens, wl.env_fraction, wl.mean_context, wl.shared_prefix
    per_slots = 1 + fit.m / max(1, fit.n) * (S + D)
    per_tokens = mu - prefix + prefix / max(1, fit.n)
    return [
        f"SGLang's balance point r* = (S+D) x token_equiv / mu = ({S}+{D}) x {shape.token_equiv:,.0f} / "
        f"{mu:,.0f} = {fit.r_star:.3f}; ours = {fit.ratio:.3f}.",
        f"r* prices every request as running: {S + D} state slots and mu = {mu:,.0f} KV tokens each. "
        f"An admitted agent sample runs only a fraction 1 - f = {1 - f:g} of its life (M = {fit.m} of "
        f"N = {fit.n} at the p99); while it waits in the environment it keeps one checkpoint slot and its KV: "
        f"1 + (M/N)(S+D) = {per_slots:.2f} slots per admitted sample, not {S + D}.",
        f"The shared prefix ({prefix:,} tokens) is one KV copy for all samples: mu - P + P/N = "
        f"{per_tokens:,.0f} tokens per sample, not {mu:,.0f}.",
        f"Per sample: ours {per_slots:.2f} slots : {per_tokens:,.0f} tokens vs r*'s {S + D} : {mu:,.0f}. At r* the "
        f"pools hold {fit.n_at_r_star} samples without eviction; at our ratio {fit.n}.",
        f"vLLM keeps one pool (no split to choose): there the model sets --max-num-seqs, the block size "
        f"and the admission limit N_ref = {n_ref}.",
    ]  # fmt: skip


def sglang_settings(
    shape: ModelShape,
    wl: Workload,
    opts: EngineOptions,
    *,
    gpu_util: float,
    cache: float,
    n_busy: int,
    n_ref: int,
    m_ref: int,
    add_row: Callable[[str, str, float, str, str], None],
) -> SGLangSettings:
    """SGLang launch flags; for hybrid models also its pool sizes (rows of the reasoning table via
    `add_row(quantity, formula, value, unit, note)`) and the comparison with r*."""
    out = SGLangSettings({"--mem-fraction-static": gpu_util, "--max-running-requests": m_ref})
    if not shape.is_hybrid:
        out.comparison.append("dense model: one KV pool, no state pool; SGLang's mamba settings do not apply.")
        return out
    fit = fit_sglang(shape, wl, opts, cache, n_busy)
    S, D = fit.slots_per_running, fit.draft_tokens
    out.args.update(
        {
            "--max-running-requests": fit.m,
            "--max-mamba-cache-size": fit.slots,
            "--mamba-full-memory-ratio": round(fit.ratio, 4) if math.isfinite(fit.ratio) else None,
        }
    )
    add_row("SGLang concurrency", f"as N_mem with S+D = {S}+{D} state slots per running request", fit.n,
            "samples", "")  # fmt: skip
    add_row("SGLang state slots", "N + M x (S + D) (+1 prefix)", fit.slots, "slots", f"M = {fit.m}")
    add_row("SGLang ratio (ours)", "slots x s / (C - slots x s)", fit.ratio, "ratio", "")
    add_row("SGLang balance point r*", "(S + D) x token_equiv / mu", fit.r_star, "ratio", "")
    add_row("samples cached at r*", "max N: N + M(S+D) slots and N(mu-P)+P tokens fit the r* pools",
            fit.n_at_r_star, "samples", "")  # fmt: skip
    out.comparison += _comparison(fit, shape, wl, n_ref)
    return out
