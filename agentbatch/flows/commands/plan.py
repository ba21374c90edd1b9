"""`agentbatch plan`: the resource model for (hybrid) LLMs, from a model config, a GPU and a workload.

Prints the reasoning table (each quantity, its formula, its value), the reference sample concurrency,
the expected recompute as a function of concurrency, and vLLM / SGLang launch settings.
Bad input (unreadable file, a field the shape can't be derived from) exits with code 2. The work is
done by the `agentbatch.planning` library; this module only maps arguments onto it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentbatch.planning import (
    GIB,
    ConfigError,
    EngineOptions,
    Hardware,
    InputError,
    PlanError,
    WorkloadSpec,
    load_model_shape,
    load_workload,
    plan,
    plan_document,
    presets,
    render_plan,
)


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        trace=Path(args.trace) if args.trace else None,
        mean_context=args.mean_context,
        p95_context=args.p95_context,
        env_fraction=args.env_fraction,
        shared_prefix=args.shared_prefix,
        peak_context=args.peak_context,
        num_samples=args.num_samples,
        output_tokens=args.output_tokens,
        new_tokens=args.new_tokens,
        prefix_groups=args.prefix_groups,
        decode_tokens_per_s=args.decode_tokens_per_s,
    )


def _options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        block_size=args.block_size,
        target_running=args.target_running,
        busy_fraction=args.busy_fraction,
        sglang_slots_per_running=args.sglang_slots_per_running,
        sglang_draft_tokens=args.sglang_draft_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )


def run(args: argparse.Namespace) -> int:
    try:
        shape = load_model_shape(
            args.model, kv_cache_dtype=args.kv_cache_dtype, state_dtype=args.state_dtype, weights_gib=args.weights_gib
        )
        hw = Hardware(
            gpu_mem_bytes=int(args.gpu_mem_gib * GIB),
            gpu_util=args.gpu_util,
            reserve_bytes=int(args.reserve_gib * GIB),
            peak_flops=args.peak_tflops * 1e12,
            mem_bw=args.mem_bw_tbps * 1e12,
        )
        wl = load_workload(_workload_spec(args))
        result = plan(shape, hw, wl, _options(args))
    except (InputError, ConfigError, PlanError) as exc:
        print(f"agentbatch plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_document(result, shape), indent=2, default=float))
    else:
        print(render_plan(result, shape, hw, wl))
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
    _add_workload_args(p)
    _add_engine_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
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


def _add_engine_args(p: argparse.ArgumentParser) -> None:
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
