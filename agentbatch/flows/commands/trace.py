"""`agentbatch trace export|import|generate|show`: batches as Parquet trace files."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentbatch.flows.commands._common import add_db_option, fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace", help="export/import a batch as a Parquet trace, generate synthetic traces",
        description="Traces are batches as files (schema: docs/traces.md): export one from the store, import "
        "one as a completed batch, generate a seeded synthetic workload family, or summarise one.",
    )
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    e = tsub.add_parser("export", help="write a batch of the store as a trace file")
    e.add_argument("batch", type=int, help="batch id")
    e.add_argument("--out", type=Path, required=True, help="trace file to write (.parquet)")
    add_db_option(e)
    e.set_defaults(func=export_main)

    i = tsub.add_parser("import", help="write a trace file into the store as a completed batch")
    i.add_argument("file", type=Path)
    i.add_argument("--name", default=None, help="batch name (default: import:<family or source batch>)")
    add_db_option(i)
    i.set_defaults(func=import_main)

    g = tsub.add_parser("generate", help="generate a synthetic trace (swe_like, widesearch_like, mcp_like, bfcl_like)")
    g.add_argument("family")
    g.add_argument("--samples", type=int, default=None, help="samples (default: the family's ablation size)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tasks", type=int, default=None, help="distinct task ids (default: one per sample)")
    g.add_argument("--epoch", type=int, default=0, help="rerun index of the same tasks (history priors)")
    g.add_argument("--turns-scale", type=float, default=1.0, help="stretch every chain by this factor")
    g.add_argument("--out", type=Path, required=True)
    g.set_defaults(func=generate_main)

    s = tsub.add_parser("show", help="summarise a trace file")
    s.add_argument("file", type=Path)
    s.set_defaults(func=show_main)


def export_main(args: argparse.Namespace) -> int:
    from agentbatch.db.store import Store
    from agentbatch.db.trace_io import export_batch
    from agentbatch.traces import write_trace

    store = Store(args.db)
    try:
        trace = export_batch(store, args.batch)
    except ValueError as exc:
        return fail(str(exc))
    finally:
        store.close()
    write_trace(trace, args.out)
    print(f"batch {args.batch}: {len(trace.samples)} samples, {trace.num_steps} steps -> {args.out}")
    return 0


def import_main(args: argparse.Namespace) -> int:
    from agentbatch.db.store import Store
    from agentbatch.db.trace_io import import_trace
    from agentbatch.traces import read_trace

    try:
        trace = read_trace(args.file)
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc))
    store = Store(args.db)
    try:
        batch_id = import_trace(store, trace, name=args.name)
    finally:
        store.close()
    print(f"{args.file}: {len(trace.samples)} samples, {trace.num_steps} steps -> batch {batch_id} in {store.url}")
    return 0


def generate_main(args: argparse.Namespace) -> int:
    from agentbatch.traces import generate, write_trace

    try:
        trace = generate(args.family, args.samples, args.seed, tasks=args.tasks, epoch=args.epoch,
                         turns_scale=args.turns_scale)  # fmt: skip
    except ValueError as exc:
        return fail(str(exc))
    write_trace(trace, args.out)
    print(f"{args.family} seed {args.seed}: {len(trace.samples)} samples, {trace.num_steps} steps, "
          f"mean score {trace.mean_score():.4f} -> {args.out}")  # fmt: skip
    return 0


def show_main(args: argparse.Namespace) -> int:
    import numpy as np

    from agentbatch.traces import read_trace

    try:
        trace = read_trace(args.file)
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc))
    steps = [len(s.steps) for s in trace.samples]
    env = [st.duration_s for s in trace.samples for st in s.environment_steps]
    prompts = [st.prompt_tokens or 0 for s in trace.samples for st in s.inference_steps]
    q = lambda xs, p: float(np.percentile(xs, p)) if xs else 0.0  # noqa: E731
    print(f"{args.file}: {len(trace.samples)} samples, {trace.num_steps} steps; meta source "
          f"{trace.meta.get('source')}, family {trace.meta.get('family')}")  # fmt: skip
    print(f"  steps per sample p50 {q(steps, 50):.0f} p99 {q(steps, 99):.0f} max {max(steps, default=0)}")
    print(f"  environment step s  p50 {q(env, 50):.3f} p99 {q(env, 99):.3f} total {sum(env):.1f}")
    print(f"  prompt tokens       p50 {q(prompts, 50):.0f} p99 {q(prompts, 99):.0f} max {max(prompts, default=0)}")
    print(f"  mean score {trace.mean_score():.4f}")
    return 0
