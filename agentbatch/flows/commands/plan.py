"""`agentbatch plan`: the resource model for (hybrid) LLMs, from a model config, a GPU and a workload.

Prints the reasoning table (each quantity, its formula, its value), the reference sample concurrency,
the expected recompute as a function of concurrency, and vLLM / SGLang launch settings.
Bad input (unreadable file, a field the shape can't be derived from) exits with code 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from agentbatch.planning.model_shape import ConfigError, ModelShape, shape_from_config
from agentbatch.planning.resource_model import GIB, EngineOptions, Hardware, Plan, PlanError, Workload, plan

PRESET_PACKAGE = "agentbatch.planning.model_configs"


class InputError(Exception):
    """Bad user input: the message names the file and field."""


def presets() -> dict[str, Any]:
    """Preset name -> resource of the shipped config.json files."""
    root = resources.files(PRESET_PACKAGE)
    return {p.name.removesuffix(".json"): p for p in root.iterdir() if p.name.endswith(".json")}


def _read_json(path: Any, label: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(
            f"{label}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}"
        )
    return {k: v for k, v in data.items() if not k.startswith("_")}  # '_' keys are agentbatch notes


def load_model(spec: str, args: argparse.Namespace) -> ModelShape:
    """A config.json path, a directory holding one, or a preset name."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    available = presets()
    if path.exists():
        cfg, label, name = (
            _read_json(path, str(path)),
            str(path),
            path.parent.name if path.name == "config.json" else path.stem,
        )
    elif spec in available:
        cfg, label, name = _read_json(available[spec], f"preset {spec}"), f"preset {spec}", spec
    else:
        raise InputError(
            f"--model {spec}: no such file, and not a preset (presets: {', '.join(sorted(available))})"
        )
    weights = int(args.weights_gib * GIB) if args.weights_gib is not None else None
    return shape_from_config(
        cfg,
        source=label,
        name=name,
        kv_cache_dtype=args.kv_cache_dtype,
        state_dtype=args.state_dtype,
        weights_bytes=weights,
    )


def workload_from_trace(trace: Any, *, decode_tokens_per_s: float, source: str) -> Workload:
    """Context distribution, environment fraction and shared prefix of a recorded or synthetic trace.

    A sample holds context c_k = prompt_k + output_k from its k-th inference step until the next one;
    each c_k is weighted by the time it is held (inference k + the environment step after it), so the
    draws are the context of a sample at a random moment. Synthetic traces carry no inference times:
    those are estimated as output tokens / `decode_tokens_per_s` (a loaded engine's per-sequence rate).
    env fraction = environment time / (inference + environment time), at zero contention.
    """
    contexts: list[float] = []
    weights: list[float] = []
    outs: list[int] = []
    news: list[int] = []
    env_total = inf_total = 0.0
    env_durations: list[float] = []
    prefixes: list[int] = []
    groups: set[str] = set()
    peak = 0
    for sample in trace.samples:
        prefixes.append(int(sample.shared_prefix_tokens or 0))
        groups.add(sample.prefix_group)
        steps = sample.steps
        held = int(sample.shared_prefix_tokens or 0)  # context already cached before this step's prompt
        for i, step in enumerate(steps):
            if step.kind == "inference":
                out = int(step.output_tokens or 0)
                prompt = int(step.prompt_tokens or 0)
                ctx = prompt + out
                outs.append(out)
                news.append(max(0, prompt - held))
                held = ctx
                inf_s = (
                    step.duration_s if step.duration_s and step.duration_s > 0 else out / decode_tokens_per_s
                )
                env_s = (
                    steps[i + 1].duration_s
                    if i + 1 < len(steps) and steps[i + 1].kind == "environment"
                    else 0.0
                )
                inf_total += inf_s
                env_total += env_s
                if env_s > 0:
                    env_durations.append(env_s)
                if ctx > 0:
                    contexts.append(ctx)
                    weights.append(max(inf_s + env_s, 1e-9))
                    peak = max(peak, ctx)
    if not contexts:
        raise InputError(f"{source}: the trace has no inference steps with token counts")
    prefixes.sort()
    return Workload(
        contexts=tuple(contexts),
        weights=tuple(weights),
        env_fraction=env_total / (env_total + inf_total) if env_total + inf_total > 0 else 0.0,
        shared_prefix=prefixes[len(prefixes) // 2],
        peak_context=peak,
        num_samples=len(trace.samples),
        source=f"trace {source}",
        output_tokens=sum(outs) / len(outs),
        new_tokens=sum(news) / len(news),
        prefix_groups=max(1, len(groups)),
        env_durations=tuple(env_durations) or None,
    )


def workload_from_csv(path: Path, env_fraction: float | None = None) -> Workload:
    """CSV with a header: `context_tokens` (required), optional `weight`, `env_fraction`,
    `shared_prefix`, `peak_context`, `sample_id`. One row per draw of a sample's context (e.g. one row
    per sample with its time-averaged context, or one per step); env fraction is the weighted mean of
    the column (or `env_fraction` when given), shared prefix its median, peak the max of peak_context
    (or of context_tokens)."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not rows or "context_tokens" not in rows[0]:
        raise InputError(
            f"{path}: field 'context_tokens': missing; expected a CSV header with a context_tokens column"
        )

    def num(row: dict[str, str], i: int, name: str, default: float | None = None) -> float:
        raw = (row.get(name) or "").strip()
        if not raw:
            if default is None:
                raise InputError(f"{path}: row {i + 2}: field {name!r}: missing value")
            return default
        try:
            return float(raw)
        except ValueError:
            raise InputError(f"{path}: row {i + 2}: field {name!r}: expected a number, got {raw!r}") from None

    ctx = [num(r, i, "context_tokens") for i, r in enumerate(rows)]
    w = [num(r, i, "weight", 1.0) for i, r in enumerate(rows)]
    has_env = "env_fraction" in rows[0] and env_fraction is None
    if not has_env and env_fraction is None:
        raise InputError(f"{path}: field 'env_fraction': missing; add the column or pass --env-fraction")
    env = [num(r, i, "env_fraction") for i, r in enumerate(rows)] if has_env else []
    prefix = sorted(num(r, i, "shared_prefix", 0.0) for i, r in enumerate(rows))
    peaks = [num(r, i, "peak_context", c) for i, (r, c) in enumerate(zip(rows, ctx, strict=True))]
    ids = {r.get("sample_id") for r in rows} if "sample_id" in rows[0] else None
    if any(c <= 0 for c in ctx):
        raise InputError(f"{path}: field 'context_tokens': expected positive token counts")
    if any(not 0 <= e < 1 for e in env):
        raise InputError(f"{path}: field 'env_fraction': expected values in [0, 1)")
    return Workload(
        contexts=tuple(ctx),
        weights=tuple(w),
        env_fraction=sum(e * x for e, x in zip(env, w, strict=True)) / sum(w)
        if has_env
        else float(env_fraction),
        shared_prefix=int(prefix[len(prefix) // 2]),
        peak_context=int(max(peaks)),
        num_samples=len(ids) if ids else None,
        source=f"csv {path.name}",
    )


def load_workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        path = Path(args.trace)
        if not path.exists():
            raise InputError(f"--trace {path}: no such file")
        if path.suffix.lower() == ".csv":
            wl = workload_from_csv(path, args.env_fraction)
        else:
            try:
                from agentbatch.traces.parquet import read_trace
            except ImportError as exc:  # pragma: no cover - the traces package ships with agentbatch
                raise InputError(
                    f"--trace {path}: Parquet traces need agentbatch.traces ({exc})"
                ) from None
            try:
                trace = read_trace(path)
            except Exception as exc:  # noqa: BLE001 - any reader failure is bad input here
                raise InputError(
                    f"{path}: not a readable agentbatch trace (Parquet, docs/traces.md): {exc}"
                ) from None
            wl = workload_from_trace(trace, decode_tokens_per_s=args.decode_tokens_per_s, source=str(path))
        overrides: dict[str, Any] = {}
        if args.env_fraction is not None:
            overrides["env_fraction"] = args.env_fraction
        if args.shared_prefix is not None:
            overrides["shared_prefix"] = args.shared_prefix
        if args.peak_context is not None:
            overrides["peak_context"] = args.peak_context
        for name in ("num_samples", "output_tokens", "new_tokens", "prefix_groups"):
            if getattr(args, name) is not None:
                overrides[name] = getattr(args, name)
        try:
            return wl.replace(**overrides)
        except PlanError as exc:
            raise InputError(f"{path}: {exc}") from None
    if args.mean_context is None or args.env_fraction is None:
        raise InputError(
            "workload: give --trace FILE, or --mean-context N and --env-fraction F "
            "(optionally --p95-context N --shared-prefix N)"
        )
    return Workload.from_stats(
        args.mean_context,
        args.p95_context,
        env_fraction=args.env_fraction,
        shared_prefix=args.shared_prefix or 0,
        peak_context=args.peak_context,
        num_samples=args.num_samples,
        output_tokens=args.output_tokens,
        new_tokens=args.new_tokens,
    ).replace(prefix_groups=args.prefix_groups or 1)


def render(p: Plan, shape: ModelShape, hw: Hardware, wl: Workload) -> str:
    out = [
        f"agentbatch plan: {shape.name} ({shape.family}{', hybrid' if shape.is_hybrid else ''}) on "
        f"{hw.gpu_mem_bytes / GIB:g} GiB GPU, workload from {wl.source}",
        f"config fields read: {', '.join(shape.fields_read)}",
        "",
        p.table(),
        "",
        f"Reference sample concurrency: {p.reference_concurrency} (bound by {p.binding}; "
        f"N_mem={p.n_mem}, N_busy={p.n_busy}"
        + (f", N_goodput={p.n_goodput}" if p.n_goodput is not None else "")
        + f"); admission limit max_active_samples={p.max_active_samples}",
        f"Expected recompute at N_ref: {p.recompute_tokens_per_step:,.0f} tokens per inference step "
        f"({100 * p.recompute_ratio:.2f} % of prompt tokens)",
        "",
        "vLLM:   " + p.vllm_command(),
        "SGLang: " + p.sglang_command(),
        "",
        "Against SGLang's balance point:",
        *("  - " + line for line in p.comparison),
        "",
        "Recompute as a function of concurrency:",
        f"  {'N':>7}  {'cache demand':>12}  {'evicted':>8}  {'returns hit':>11}  {'recompute/step':>14}  {'rate':>7}",
    ]
    for c in p.recompute_curve:
        mark = "  <- N_ref" if c["concurrency"] == p.reference_concurrency else ""
        mark += "  (running set alone overflows: preemption)" if c["running_overflows"] else ""
        out.append(
            f"  {c['concurrency']:>7,.0f}  {c['demand_gib']:>8,.1f} GiB  {c['evicted_fraction']:>8.3f}  "
            f"{c['returning_evicted']:>11.3f}  "
            f"{c['recompute_tokens_per_step']:>14,.0f}  {100 * c['recompute_ratio']:>6.2f}%{mark}"
        )
    if p.notes:
        out += ["", "Notes:", *("  - " + n for n in p.notes)]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        shape = load_model(args.model, args)
        hw = Hardware(
            gpu_mem_bytes=int(args.gpu_mem_gib * GIB),
            gpu_util=args.gpu_util,
            reserve_bytes=int(args.reserve_gib * GIB),
            peak_flops=args.peak_tflops * 1e12,
            mem_bw=args.mem_bw_tbps * 1e12,
        )
        wl = load_workload(args)
        opts = EngineOptions(
            block_size=args.block_size,
            target_running=args.target_running,
            busy_fraction=args.busy_fraction,
            sglang_slots_per_running=args.sglang_slots_per_running,
            sglang_draft_tokens=args.sglang_draft_tokens,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
        result = plan(shape, hw, wl, opts)
    except (InputError, ConfigError, PlanError) as exc:
        print(f"agentbatch plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        doc = result.to_dict() | {
            "model_shape": {
                "name": shape.name,
                "family": shape.family,
                "layers": shape.num_layers,
                "attention_layers": shape.attention_layers,
                "state_layers": shape.state_layer_count,
                "kv_bytes_per_token": shape.kv_bytes_per_token,
                "state_bytes_per_seq": shape.state_bytes_per_seq,
                "weights_bytes": shape.weights_bytes,
                "fields_read": list(shape.fields_read),
            },
            "vllm_command": result.vllm_command(),
            "sglang_command": result.sglang_command(),
        }
        print(json.dumps(doc, indent=2, default=float))
    else:
        print(render(result, shape, hw, wl))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="resource model: KV/state memory split, reference concurrency, engine settings",
        description="Compute, for a (hybrid) LLM on one GPU and an agent workload, the KV-pool / state-pool split, "
        "the reference sample concurrency, the expected recompute, and vLLM / SGLang launch settings, "
        "with a table of the reasoning. See docs/plan.md.",
    )
    p.add_argument(
        "--model",
        required=True,
        help=f"config.json path, a model directory, or a preset ({', '.join(sorted(presets()))})",
    )
    p.add_argument(
        "--gpu-mem-gib", type=float, required=True, help="GPU memory in GiB (e.g. 141 for an H200)"
    )
    p.add_argument(
        "--gpu-util", type=float, default=0.9, help="share of GPU memory the engine may use (default 0.9)"
    )
    p.add_argument(
        "--weights-gib", type=float, help="weights size in GiB (default: estimated from the config)"
    )
    p.add_argument(
        "--reserve-gib",
        type=float,
        default=3.0,
        help="activations / CUDA graphs / overhead reserve (default 3)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=989.0,
        help="dense BF16 TFLOP/s for the roofline (default 989, H100/H200)",
    )
    p.add_argument(
        "--mem-bw-tbps", type=float, default=4.8, help="HBM bandwidth TB/s (default 4.8, H200; H100 3.35)"
    )
    p.add_argument("--kv-cache-dtype", help="KV cache dtype (default: the model dtype), e.g. fp8")
    p.add_argument(
        "--state-dtype", help="recurrent-state dtype (default: model dtype; float32 for lightning attention)"
    )
    w = p.add_argument_group("workload (a trace, or the statistics)")
    w.add_argument(
        "--trace", help="a trace: Parquet (docs/traces.md) or CSV with a context_tokens column (docs/plan.md)"
    )
    w.add_argument("--mean-context", type=float, help="mean context tokens of a sample at a random moment")
    w.add_argument("--p95-context", type=float, help="95th percentile of that context (lognormal fit)")
    w.add_argument(
        "--env-fraction", type=float, help="share of a sample's time spent waiting on the environment"
    )
    w.add_argument(
        "--shared-prefix", type=int, help="prompt tokens shared by all samples (system prompt, tools)"
    )
    w.add_argument("--peak-context", type=int, help="longest context a sample reaches (sets --max-model-len)")
    w.add_argument("--num-samples", type=int, help="batch size (an upper bound on concurrency)")
    w.add_argument(
        "--output-tokens", type=float, help="mean output tokens per inference step (enables the goodput pick)"
    )
    w.add_argument(
        "--new-tokens", type=float, help="mean new prompt tokens per step (observations; goodput pick)"
    )
    w.add_argument("--prefix-groups", type=int, help="distinct shared prefixes (each stored once; default 1)")
    w.add_argument(
        "--decode-tokens-per-s",
        type=float,
        default=40.0,
        help="per-sequence decode rate to estimate inference time of traces without it (default 40)",
    )
    e = p.add_argument_group("engine")
    e.add_argument(
        "--block-size", type=int, help="force a block size (hybrid: raised to the state page if too small)"
    )
    e.add_argument(
        "--target-running", type=int, help="running batch that keeps the GPU busy (default: roofline)"
    )
    e.add_argument(
        "--busy-fraction", type=float, default=0.9, help="share of asymptotic decode throughput = busy"
    )
    e.add_argument("--max-num-batched-tokens", type=int, default=8192, help="prefill token budget per step")
    e.add_argument(
        "--sglang-slots-per-running", type=int, default=5, help="SGLang S (extra_buffer 5, no_buffer 3)"
    )
    e.add_argument("--sglang-draft-tokens", type=int, default=0, help="SGLang D (speculative draft tokens)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def concurrency_for_profile(
    trace: Any,
    profile: Any,
    *,
    workers: int = 1,
    iterations: int = 4,
    allow_recompute: bool = True,
) -> tuple[int, dict[str, float]]:
    """Reference concurrency (all workers together) for a trace on simulated-engine workers.

    `profile` is an `EngineProfile` (sim/profiles.py): its KV capacity, block size,
    checkpoint pool, max running batch and cost model are the engine. The trace's inference steps
    carry no durations, so the environment fraction f depends on the engine's speed: start from
    40 tokens/s per sequence, then re-estimate the per-sequence decode rate 1 / t_decode(R) at the
    running batch R = (1 - f) N_ref the plan picks, a few times (a fixed point).
    """
    from agentbatch.planning.resource_model import LinearCost, reference_concurrency

    c = profile.cost
    cost = LinearCost(c.c0, c.c_prefill, c.c_decode, c.c_attn)
    max_running = min(profile.max_num_seqs, profile.state_slots or profile.max_num_seqs)
    rate = 40.0
    n_ref, bounds = 1, {}
    for _ in range(max(1, iterations)):
        wl = workload_from_trace(trace, decode_tokens_per_s=rate, source="trace")
        if wl.num_samples:
            wl = wl.replace(num_samples=max(1, wl.num_samples // workers))
        n_ref, bounds = reference_concurrency(
            kv_capacity_tokens=profile.kv_capacity_tokens,
            block_size=profile.block_size,
            workload=wl,
            checkpoint_slots=profile.state_checkpoints if profile.state_slots is not None else None,
            max_running=max_running,
            cost=cost,
            allow_recompute=allow_recompute,
        )
        running = max(1.0, min(n_ref * (1 - wl.env_fraction), max_running))
        rate = 1.0 / cost.decode_step(running, wl.mean_context)
        bounds = dict(bounds, env_fraction=wl.env_fraction, decode_tokens_per_s=rate)
    return n_ref * workers, bounds
