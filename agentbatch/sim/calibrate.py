"""Fit a profile's cost model to measured request timings (least squares, numpy).

A request's time splits into iterations: its decode took `output_tokens - 1` steps, so
decode_s / (output_tokens - 1) is the mean duration of the steps it decoded in; its prefill took the
steps from its first scheduling to its first token. The composition of those steps (sequences
decoding, prefill tokens, context read) is reconstructed from the other requests on the same worker
that overlapped in time: a request decodes during [first token, finish] and computes its uncached
prompt tokens evenly over [first scheduled, first token]. Each request gives one row per phase:

    measured step time  ~  c0 + c_prefill * P + c_decode * D + c_attn * A + c_prefill_attn * Q

solved for the coefficients by least squares on relative errors, with a light pull towards the base
profile's values (so a coefficient the data cannot pin down keeps its base value) and no negative
coefficients. Input: the store's completed inference steps of a batch, or a CSV / Parquet table with
the same columns (see REQUIRED / OPTIONAL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentbatch.sim.profiles import EngineProfile

COEFFS = ("c0", "c_prefill", "c_decode", "c_attn", "c_prefill_attn")
REQUIRED = ("prompt_tokens", "output_tokens", "started_at", "finished_at")
OPTIONAL = ("cached_prompt_tokens", "prefill_s", "decode_s", "engine_queue_s", "worker", "sample_id", "index")


@dataclass
class Timings:
    """Per-request columns as numpy arrays (one entry per request)."""

    prompt: np.ndarray
    cached: np.ndarray
    output: np.ndarray
    start: np.ndarray  # request sent (s)
    finish: np.ndarray  # last token (s)
    queue: np.ndarray  # engine queue time, NaN if unknown
    prefill: np.ndarray  # NaN if unknown
    decode: np.ndarray  # NaN if unknown
    worker: np.ndarray  # str
    sample: np.ndarray | None = None  # sample ids (NaN if unknown), to chain a sample's turns

    def __len__(self) -> int:
        return len(self.prompt)


@dataclass
class FitResult:
    profile: EngineProfile
    coefficients: dict[str, float]
    base: dict[str, float]
    rows: int
    requests: int
    rel_rms: float  # relative RMS error of the fitted step times
    mape: float  # mean absolute percentage error of the fitted step times
    rel_rms_base: float  # the same for the base profile's coefficients
    per_phase: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["profile"] = self.profile.to_dict()
        return d

    def to_text(self) -> str:
        lines = [f"cost model fit: {self.requests} requests, {self.rows} rows (profile {self.profile.name})"]
        lines.append(f"  {'coefficient':<16}{'fitted':>14}{'base':>14}")
        for k in COEFFS:
            lines.append(f"  {k:<16}{self.coefficients[k]:>14.4g}{self.base[k]:>14.4g}")
        lines.append(
            f"  step-time error: relative RMS {self.rel_rms:.1%}, MAPE {self.mape:.1%} "
            f"(base profile: relative RMS {self.rel_rms_base:.1%})"
        )
        for phase, e in self.per_phase.items():
            lines.append(f"    {phase:<8} rows {int(e['rows']):>6}  MAPE {e['mape']:.1%}")
        return "\n".join(lines)


def timings_from_records(records: list[dict[str, Any]]) -> Timings:
    """Rows as dicts with REQUIRED (and optionally OPTIONAL) keys; rows missing a required value are skipped."""
    keep = [
        r
        for r in records
        if all(r.get(k) is not None for k in REQUIRED) and (r.get("output_tokens") or 0) > 0
    ]
    if not keep:
        raise ValueError(f"no usable request timings (need {', '.join(REQUIRED)} and output_tokens > 0)")

    def col(name: str, default: float = np.nan) -> np.ndarray:
        return np.array([float(r[name]) if r.get(name) is not None else default for r in keep], dtype=float)

    return Timings(
        prompt=col("prompt_tokens"),
        cached=col("cached_prompt_tokens", 0.0),
        output=col("output_tokens"),
        start=col("started_at"),
        finish=col("finished_at"),
        queue=col("engine_queue_s"),
        prefill=col("prefill_s"),
        decode=col("decode_s"),
        worker=np.array([str(r.get("worker") or "") for r in keep], dtype=object),
        sample=col("sample_id"),
    )


def timings_from_store(store: Any, batch_id: int) -> Timings:
    """Completed inference steps of a batch (agentbatch.db.store.Store)."""
    records = []
    for st in store.steps(batch_id):
        if st.kind != "inference" or st.status != "completed":
            continue
        records.append(
            {k: getattr(st, k) for k in REQUIRED + OPTIONAL if k not in ("sample_id",)}
            | {"sample_id": st.sample_id}
        )
    if not records:
        raise ValueError(f"batch {batch_id} has no completed inference steps")
    return timings_from_records(records)


def timings_from_file(path: str | Path) -> Timings:
    """A CSV or Parquet table with REQUIRED (and optionally OPTIONAL) columns."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    df = pd.read_parquet(path) if path.suffix in (".parquet", ".pq") else pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: missing columns {missing}; need {list(REQUIRED)}, optionally {list(OPTIONAL)}"
        )
    df = df.astype(object).where(df.notna(), None)
    return timings_from_records(df.to_dict("records"))


# --- the design matrix ---------------------------------------------------------------------------


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: float, b1: float) -> np.ndarray:
    overlap: np.ndarray = np.clip(np.minimum(a1, b1) - np.maximum(a0, b0), 0.0, None)
    return overlap


@dataclass
class _Phases:
    """One worker's requests: decode windows [first_tok, fin], prefill windows [sched, first_tok]."""

    first_tok: np.ndarray
    fin: np.ndarray
    sched: np.ndarray
    ctx_mid: np.ndarray
    rate_tok: np.ndarray
    rate_pairs: np.ndarray

    def window_for(self, j: int) -> Callable[[float, float], tuple[float, float, float, float]]:
        def window(a: float, b: float) -> tuple[float, float, float, float]:
            """Time-averaged decoding seqs and context of the others, and their prefill tokens / pairs
            computed in [a, b]."""
            length = max(b - a, 1e-9)
            d_ov = _overlap(self.first_tok, self.fin, a, b)
            d_ov[j] = 0.0
            p_ov = _overlap(self.sched, self.first_tok, a, b)
            p_ov[j] = 0.0
            dec = float(d_ov.sum() / length)
            att = float((d_ov * self.ctx_mid).sum() / length)
            return dec, att, float((p_ov * self.rate_tok).sum()), float((p_ov * self.rate_pairs).sum())

        return window


BURST_FRACTION = 0.2


def burst_delivered(t: Timings) -> np.ndarray:
    """Requests whose measured decode is implausibly fast (per token under BURST_FRACTION of the
    median): a starved API server delivered their tokens in one burst at the end, so the client saw
    ~0 s of decode and a TTFT covering everything. Their split would tell the fit that decode steps
    cost nothing; only their total latency is used."""
    known = ~np.isnan(t.prefill) & ~np.isnan(t.decode) & (t.output > 1)
    per_token = np.where(known, np.nan_to_num(t.decode) / np.clip(t.output - 1, 1, None), np.nan)
    if not known.any():
        return np.zeros(len(t), dtype=bool)
    burst: np.ndarray = known & (per_token < BURST_FRACTION * np.nanmedian(per_token))
    return burst


def design_rows(t: Timings, base: EngineProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X, y, phase, fixed): one row per request phase (phase 0 = decode, 1 = prefill, 2 = whole
    request) and the fixed MoE expert-read part of each row's y (from the base cost model)."""
    rows: list[np.ndarray] = []
    ys: list[float] = []
    phases: list[int] = []
    fixed: list[float] = []
    budget = float(base.max_num_batched_tokens)
    cost = base.cost
    burst = burst_delivered(t)

    def moe(tokens: float) -> float:  # expert-weight read of one step with `tokens` tokens
        if not cost.moe_weight_s:
            return 0.0
        return float(cost.moe_weight_s * (1.0 - (1.0 - cost.moe_active_frac) ** tokens))

    def moe_steps(n_it: float, seqs: float, prefill: float, chunk: float) -> float:
        """n_it steps with `seqs` decoding sequences; the `prefill` tokens of the window come in
        chunks of about `chunk` tokens, each in one step (a concave term: do not average it)."""
        k = min(n_it, max(1.0, np.ceil(prefill / chunk))) if prefill > 0 else 0.0
        with_prefill = k * moe(prefill / k + seqs) if k else 0.0
        return with_prefill + (n_it - k) * moe(seqs)

    for w in np.unique(t.worker):
        idx = np.flatnonzero(t.worker == w)
        queue = np.nan_to_num(t.queue[idx], nan=0.0)
        sched = t.start[idx] + queue
        known = ~np.isnan(t.prefill[idx]) & ~np.isnan(t.decode[idx]) & ~burst[idx]
        first_tok = np.where(known, sched + np.nan_to_num(t.prefill[idx]), sched)
        fin = t.finish[idx]
        new = np.clip(t.prompt[idx] - t.cached[idx], 1.0, None)
        chunk = float(min(budget, max(1.0, new.mean())))
        pairs = new * t.cached[idx] + new * (new + 1) / 2
        ctx_mid = t.prompt[idx] + t.output[idx] / 2  # mean context of a decoding sequence
        pre_len = np.clip(first_tok - sched, 1e-9, None)
        rate_tok = np.where(known, new / pre_len, 0.0)
        rate_pairs = np.where(known, pairs / pre_len, 0.0)
        out = t.output[idx]
        ph = _Phases(first_tok, fin, sched, ctx_mid, rate_tok, rate_pairs)
        for j in range(len(idx)):
            window = ph.window_for(j)
            if known[j] and out[j] > 1 and t.decode[idx[j]] > 0:
                n_it = out[j] - 1
                dec, att, ptok, ppairs = window(first_tok[j], fin[j])
                rows.append(np.array([1.0, ptok / n_it, dec + 1.0, att + ctx_mid[j], ppairs / n_it]))
                ys.append(float(t.decode[idx[j]] / n_it))
                fixed.append(moe_steps(n_it, dec + 1.0, ptok, chunk) / n_it)
                phases.append(0)
            if known[j] and t.prefill[idx[j]] > 0:
                dec, att, ptok, ppairs = window(sched[j], first_tok[j])
                tokens = new[j] + ptok
                n_it = max(1.0, np.ceil(tokens / budget))
                rows.append(np.array([n_it, tokens, dec * n_it, att * n_it, pairs[j] + ppairs]))
                ys.append(float(t.prefill[idx[j]]))
                fixed.append(n_it * moe(tokens / n_it + dec))
                phases.append(1)
            if not known[j]:  # only the total latency: prefill step(s) + out - 1 decode steps
                total = fin[j] - sched[j]
                if total <= 0:
                    continue
                dec, att, ptok, ppairs = window(sched[j], fin[j])
                n_pre = max(1.0, np.ceil(new[j] / budget))
                n_it = n_pre + out[j] - 1
                x = [
                    n_it,
                    new[j] + ptok,
                    (dec + 1.0) * n_it - n_pre,
                    (att + ctx_mid[j]) * n_it,
                    pairs[j] + ppairs,
                ]
                rows.append(np.array(x))
                ys.append(float(total))
                fixed.append(
                    n_pre * moe(new[j] / n_pre + dec) + moe_steps(n_it - n_pre, dec + 1.0, ptok, chunk)
                )
                phases.append(2)
    if not rows:
        raise ValueError("no request has a measurable phase (decode_s, prefill_s or a positive latency)")
    return np.vstack(rows), np.array(ys), np.array(phases), np.array(fixed)


def _solve(X: np.ndarray, y: np.ndarray, fixed: np.ndarray, prior: np.ndarray, strength: float) -> np.ndarray:
    """min sum(((Xc + fixed - y)/y)^2) + strength * n * sum(((c - prior)/scale)^2), c >= 0 (active set)."""
    w = 1.0 / np.clip(y, 1e-12, None)
    A = X * w[:, None]
    b = (y - fixed) * w
    # scale each coefficient by its typical contribution, so the pull is unit-free
    scale = np.where(prior > 0, prior, np.abs(np.linalg.lstsq(A, b, rcond=None)[0]) + 1e-30)
    lam = np.sqrt(strength * len(y))
    active = np.ones(X.shape[1], dtype=bool)
    c = np.zeros(X.shape[1])
    for _ in range(X.shape[1] + 1):
        cols = np.flatnonzero(active)
        As = np.vstack([A[:, cols] * scale[cols], lam * np.eye(len(cols))])
        bs = np.concatenate([b, lam * prior[cols] / scale[cols]])
        sol = np.linalg.lstsq(As, bs, rcond=None)[0] * scale[cols]
        c = np.zeros(X.shape[1])
        c[cols] = sol
        if (sol >= 0).all():
            break
        active[cols[sol < 0]] = False
    return c


def fit_cost_model(t: Timings, base: EngineProfile, *, prior_strength: float = 1e-3) -> FitResult:
    X, y, phase, fixed = design_rows(t, base)
    prior = np.array([getattr(base.cost, k) for k in COEFFS])
    c = _solve(X, y, fixed, prior, prior_strength)
    pred = X @ c + fixed
    rel = (pred - y) / y
    base_rel = (X @ prior + fixed - y) / y
    per_phase = {}
    for code, label in ((0, "decode"), (1, "prefill"), (2, "request")):
        m = phase == code
        if m.any():
            per_phase[label] = {"rows": float(m.sum()), "mape": float(np.mean(np.abs(rel[m])))}
    cost = dataclasses.replace(base.cost, **{k: float(v) for k, v in zip(COEFFS, c, strict=True)})
    return FitResult(
        profile=dataclasses.replace(base, cost=cost, name=f"{base.name}-calibrated"),
        coefficients={k: float(v) for k, v in zip(COEFFS, c, strict=True)},
        base={k: float(v) for k, v in zip(COEFFS, prior, strict=True)},
        rows=len(y),
        requests=len(t),
        rel_rms=float(np.sqrt(np.mean(rel**2))),
        mape=float(np.mean(np.abs(rel))),
        rel_rms_base=float(np.sqrt(np.mean(base_rel**2))),
        per_phase=per_phase,
    )


# --- checking a profile against the measured requests ------------------------------------------


def compare_to_measured(profile: EngineProfile, t: Timings) -> dict[str, float]:
    """Re-run the measured requests through the model (one EngineModel per worker, each request
    arriving when it was sent) and compare latencies, request by request.

    Token ids are not in the timings, so prompts are rebuilt to give the measured prefix hits: a
    request reuses the first `cached_prompt_tokens` tokens of its sample's previous prompt (or of a
    shared pool when the sample is unknown) and adds fresh tokens up to `prompt_tokens`.
    """
    from agentbatch.sim.drive import drive
    from agentbatch.sim.model import SimRequest

    measured, simulated, cached_m, cached_s = [], [], [], []
    fresh = 1 << 40
    for w in np.unique(t.worker):
        idx = np.flatnonzero(t.worker == w)
        idx = idx[np.argsort(t.start[idx], kind="stable")]
        t0 = float(t.start[idx[0]])
        pools: dict[object, list[int]] = {}
        arrivals = []
        for k, i in enumerate(idx):
            key: object = "shared"
            if t.sample is not None and not np.isnan(t.sample[i]):
                key = int(t.sample[i])
            pool = pools.get(key, [])
            keep = int(min(t.cached[i], len(pool), t.prompt[i] - 1))
            n_new = int(t.prompt[i]) - keep
            prompt = pool[:keep] + list(range(fresh, fresh + n_new))
            fresh += n_new
            pools[key] = prompt
            sid = key if isinstance(key, int) else -1 - k
            arrivals.append((float(t.start[i]) - t0, SimRequest(f"{w}:{k}", sid, prompt, int(t.output[i]))))
        stats = drive(profile, arrivals).by_id()
        for k, i in enumerate(idx):
            st = stats[f"{w}:{k}"]
            measured.append(float(t.finish[i] - t.start[i]))
            simulated.append(st.finished - st.arrival)
            cached_m.append(float(t.cached[i]))
            cached_s.append(float(st.cached_prompt_tokens))
    m, sim = np.array(measured), np.array(simulated)
    ok = m > 0
    rel = (sim[ok] - m[ok]) / m[ok]
    return {
        "requests": float(len(m)),
        "latency_mape": float(np.mean(np.abs(rel))) if ok.any() else float("nan"),
        "latency_median_ratio": float(np.median(sim[ok] / m[ok])) if ok.any() else float("nan"),
        "total_latency_ratio": float(sim.sum() / m.sum()) if m.sum() > 0 else float("nan"),
        "cached_tokens_ratio": float(sum(cached_s) / sum(cached_m)) if sum(cached_m) else float("nan"),
    }
