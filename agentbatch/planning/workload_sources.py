"""Workloads for the resource model from a trace (Parquet), a CSV of context lengths, or statistics.

Errors name the file, the row and the field at fault (`InputError`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbatch.planning.errors import InputError, PlanError
from agentbatch.planning.workload import Workload


@dataclass
class _TraceTally:
    """What a pass over a trace's inference steps collects."""

    contexts: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    outs: list[int] = field(default_factory=list)
    news: list[int] = field(default_factory=list)
    env_durations: list[float] = field(default_factory=list)
    prefixes: list[int] = field(default_factory=list)
    groups: set[str] = field(default_factory=set)
    env_total: float = 0.0
    inf_total: float = 0.0
    peak: int = 0

    def add_sample(self, sample: Any, decode_tokens_per_s: float) -> None:
        self.prefixes.append(int(sample.shared_prefix_tokens or 0))
        self.groups.add(sample.prefix_group)
        steps = sample.steps
        held = int(sample.shared_prefix_tokens or 0)  # context already cached before this step's prompt
        for i, step in enumerate(steps):
            if step.kind != "inference":
                continue
            following = steps[i + 1] if i + 1 < len(steps) else None
            env_s = following.duration_s if following is not None and following.kind == "environment" else 0.0
            held = self._add_inference(step, env_s, held, decode_tokens_per_s)

    def _add_inference(self, step: Any, env_s: float, held: int, decode_tokens_per_s: float) -> int:
        out = int(step.output_tokens or 0)
        prompt = int(step.prompt_tokens or 0)
        ctx = prompt + out
        self.outs.append(out)
        self.news.append(max(0, prompt - held))
        inf_s = step.duration_s if step.duration_s and step.duration_s > 0 else out / decode_tokens_per_s
        self.inf_total += inf_s
        self.env_total += env_s
        if env_s > 0:
            self.env_durations.append(env_s)
        if ctx > 0:
            self.contexts.append(ctx)
            self.weights.append(max(inf_s + env_s, 1e-9))
            self.peak = max(self.peak, ctx)
        return ctx


def workload_from_trace(trace: Any, *, decode_tokens_per_s: float, source: str) -> Workload:
    """Context distribution, environment fraction and shared prefix of a recorded or synthetic trace.

    A sample holds context c_k = prompt_k + output_k from its k-th inference step until the next one;
    each c_k is weighted by the time it is held (inference k + the environment step after it), so the
    draws are the context of a sample at a random moment. Synthetic traces carry no inference times:
    those are estimated as output tokens / `decode_tokens_per_s` (a loaded engine's per-sequence rate).
    env fraction = environment time / (inference + environment time), at zero contention.
    """
    t = _TraceTally()
    for sample in trace.samples:
        t.add_sample(sample, decode_tokens_per_s)
    if not t.contexts:
        raise InputError(f"{source}: the trace has no inference steps with token counts")
    t.prefixes.sort()
    busy = t.env_total + t.inf_total
    return Workload(
        contexts=tuple(t.contexts),
        weights=tuple(t.weights),
        env_fraction=t.env_total / busy if busy > 0 else 0.0,
        shared_prefix=t.prefixes[len(t.prefixes) // 2],
        peak_context=t.peak,
        num_samples=len(trace.samples),
        source=f"trace {source}",
        output_tokens=sum(t.outs) / len(t.outs),
        new_tokens=sum(t.news) / len(t.news),
        prefix_groups=max(1, len(t.groups)),
        env_durations=tuple(t.env_durations) or None,
    )


def _read_csv_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not rows or "context_tokens" not in rows[0]:
        raise InputError(
            f"{path}: field 'context_tokens': missing; expected a CSV header with a context_tokens column"
        )
    return rows


def _column_reader(path: Path, rows: list[dict[str, str]]) -> Callable[..., list[float]]:
    """column(name, default=None | number | list of per-row defaults) -> the column as numbers."""

    def num(row: dict[str, str], i: int, name: str, default: float | None) -> float:
        raw = (row.get(name) or "").strip()
        if not raw:
            if default is None:
                raise InputError(f"{path}: row {i + 2}: field {name!r}: missing value")
            return default
        try:
            return float(raw)
        except ValueError:
            raise InputError(f"{path}: row {i + 2}: field {name!r}: expected a number, got {raw!r}") from None

    def column(name: str, default: float | list[float] | None = None) -> list[float]:
        defaults = default if isinstance(default, list) else [default] * len(rows)
        return [num(r, i, name, d) for i, (r, d) in enumerate(zip(rows, defaults, strict=True))]

    return column


def workload_from_csv(path: Path, env_fraction: float | None = None) -> Workload:
    """CSV with a header: `context_tokens` (required), optional `weight`, `env_fraction`,
    `shared_prefix`, `peak_context`, `sample_id`. One row per draw of a sample's context (e.g. one row
    per sample with its time-averaged context, or one per step); env fraction is the weighted mean of
    the column (or `env_fraction` when given), shared prefix its median, peak the max of peak_context
    (or of context_tokens)."""
    rows = _read_csv_rows(path)
    column = _column_reader(path, rows)
    ctx = column("context_tokens")
    w = column("weight", 1.0)
    if env_fraction is None and "env_fraction" not in rows[0]:
        raise InputError(f"{path}: field 'env_fraction': missing; add the column or pass --env-fraction")
    env = column("env_fraction") if env_fraction is None else []
    prefix = sorted(column("shared_prefix", 0.0))
    peaks = column("peak_context", ctx)
    ids = {r.get("sample_id") for r in rows} if "sample_id" in rows[0] else None
    if any(c <= 0 for c in ctx):
        raise InputError(f"{path}: field 'context_tokens': expected positive token counts")
    if any(not 0 <= e < 1 for e in env):
        raise InputError(f"{path}: field 'env_fraction': expected values in [0, 1)")
    return Workload(
        contexts=tuple(ctx),
        weights=tuple(w),
        env_fraction=sum(e * x for e, x in zip(env, w, strict=True)) / sum(w) if env_fraction is None
        else float(env_fraction),
        shared_prefix=int(prefix[len(prefix) // 2]),
        peak_context=int(max(peaks)),
        num_samples=len(ids) if ids else None,
        source=f"csv {path.name}",
    )


@dataclass(frozen=True)
class WorkloadSpec:
    """Where a workload comes from: a trace file (Parquet or CSV) or statistics, plus overrides."""

    trace: Path | None = None
    mean_context: float | None = None
    p95_context: float | None = None
    env_fraction: float | None = None
    shared_prefix: int | None = None
    peak_context: int | None = None
    num_samples: int | None = None
    output_tokens: float | None = None
    new_tokens: float | None = None
    prefix_groups: int | None = None
    decode_tokens_per_s: float = 40.0

    def overrides(self) -> dict[str, Any]:
        """Fields given explicitly, which replace what a trace says."""
        names = ("env_fraction", "shared_prefix", "peak_context", "num_samples", "output_tokens", "new_tokens",
                 "prefix_groups")  # fmt: skip
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def _read_parquet_trace(path: Path) -> Any:
    from agentbatch.traces.parquet import read_trace

    try:
        return read_trace(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is bad input here
        raise InputError(f"{path}: not a readable agentbatch trace (Parquet, docs/traces.md): {exc}") from None


def _workload_from_file(spec: WorkloadSpec, path: Path) -> Workload:
    if not path.exists():
        raise InputError(f"--trace {path}: no such file")
    if path.suffix.lower() == ".csv":
        wl = workload_from_csv(path, spec.env_fraction)
    else:
        wl = workload_from_trace(
            _read_parquet_trace(path), decode_tokens_per_s=spec.decode_tokens_per_s, source=str(path)
        )
    try:
        return wl.replace(**spec.overrides())
    except PlanError as exc:
        raise InputError(f"{path}: {exc}") from None


def load_workload(spec: WorkloadSpec) -> Workload:
    """The workload a spec describes; InputError names what is missing or wrong."""
    if spec.trace is not None:
        return _workload_from_file(spec, Path(spec.trace))
    if spec.mean_context is None or spec.env_fraction is None:
        raise InputError(
            "workload: give --trace FILE, or --mean-context N and --env-fraction F "
            "(optionally --p95-context N --shared-prefix N)"
        )
    return Workload.from_stats(
        spec.mean_context,
        spec.p95_context,
        env_fraction=spec.env_fraction,
        shared_prefix=spec.shared_prefix or 0,
        peak_context=spec.peak_context,
        num_samples=spec.num_samples,
        output_tokens=spec.output_tokens,
        new_tokens=spec.new_tokens,
    ).replace(prefix_groups=spec.prefix_groups or 1)
