"""`agentbatch replay TRACE`: re-run a recorded batch with chosen policies and capacities.

--mode virtual (default): a discrete-event simulation in virtual time (simulated engine workers,
recorded environment durations); prints makespan, its lower bound, cache reuse, tail latency, score.
--mode live: a real batch through the Prefect flow: workload "recorded" (recorded observations after
the recorded durations) and engine "replay" (real inference forced to the recorded output lengths,
against --endpoint URLs or the simulated engine in real time); the batch lands in the store.
Scores of a replay equal the recording's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentbatch.flows.commands._common import add_db_option, fail, quiet_prefect_defaults


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="replay a trace (virtual time or live) with chosen policies and capacities",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, help="trace file (.parquet; see `agentbatch trace`)")
    p.add_argument("--mode", choices=("virtual", "live"), default="virtual")
    p.add_argument("--engine", choices=("simulated", "openai"), default="simulated",
                   help="live mode: simulated engine in real time, or OpenAI-compatible --endpoint(s)")
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); repeat for more workers")
    p.add_argument("--model", default="default", help="model name sent to the endpoints")
    p.add_argument("--profile", default="llama3-8b-h100", help="simulated engine profile (name or .json)")
    p.add_argument("--workers", type=int, default=2, help="simulated engine workers")
    p.add_argument("--router", default="round_robin", help="round_robin | least_loaded | trajectory_aware")
    p.add_argument("--env-queue", default="fifo", help="fifo | caas | caas_history")
    p.add_argument("--inference-queue", default="fifo", help="fifo | caas | caas_history")
    p.add_argument("--priority", default="fcfs", help="fcfs | chain_progress")
    p.add_argument("--policy-param", action="append", default=[], metavar="WHAT.KEY=VALUE",
                   help="policy parameter, e.g. router.balance_abs=16 or env_queue.max_wait_s=300")
    p.add_argument("--env-slots", type=int, default=16)
    p.add_argument("--max-active", type=int, default=64, help="samples admitted at once")
    p.add_argument("--per-worker-inflight", type=int, default=None,
                   help="requests in flight per worker (default: the profile's max_num_seqs; live: 64)")
    p.add_argument("--coupled", action="store_true", help="baseline: a sample holds an environment slot while admitted")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply recorded environment durations (and, "
                   "live with the simulated engine, its speed)")
    p.add_argument("--priors", type=Path, default=None,
                   help="virtual mode: an earlier trace of the same tasks; its chain lengths are the "
                   "history-aware CAAS priors (live mode reads them from the store)")
    p.add_argument("--samples", type=int, default=None, help="replay only the first N samples")
    p.add_argument("--seed", type=int, default=0,
                   help="recorded with the result; the replay itself is deterministic and draws no random numbers")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_db_option(p)
    p.set_defaults(func=main)


def _params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"router": {}, "env_queue": {}, "inference_queue": {}, "priority": {}}
    for item in args.policy_param:
        key, sep, raw = item.partition("=")
        what, dot, name = key.partition(".")
        if not sep or not dot or what not in out:
            raise ValueError(f"--policy-param {item!r}: expected WHAT.KEY=VALUE with WHAT in {sorted(out)}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[what][name] = value
    return out


def main(args: argparse.Namespace) -> int:
    from agentbatch.scheduling import registry

    for what, name, table in (("--router", args.router, registry.ROUTERS),
                              ("--env-queue", args.env_queue, registry.QUEUE_POLICIES),
                              ("--inference-queue", args.inference_queue, registry.QUEUE_POLICIES),
                              ("--priority", args.priority, registry.PRIORITIES)):  # fmt: skip
        if name not in table:
            return fail(f"{what}: unknown name {name!r}; expected one of {sorted(table)}")
    try:
        params = _params(args)
    except ValueError as exc:
        return fail(str(exc))
    if not args.trace.is_file():
        return fail(f"{args.trace}: no such trace file")
    if args.mode == "virtual":
        return _virtual(args, params)
    return _live(args, params)


def _virtual(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> int:
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import chain_priors, read_trace

    trace = read_trace(args.trace)
    if args.samples is not None:
        trace.samples = trace.samples[: args.samples]
    priors = chain_priors(read_trace(args.priors)) if args.priors else None
    cfg = VirtualConfig(
        workers=args.workers, profile=args.profile, max_active=args.max_active, env_slots=args.env_slots,
        per_worker_inflight=args.per_worker_inflight, coupled=args.coupled,
        router=PolicySpec(args.router, params["router"]), env_queue=PolicySpec(args.env_queue, params["env_queue"]),
        inference_queue=PolicySpec(args.inference_queue, params["inference_queue"]),
        priority=PolicySpec(args.priority, params["priority"]), env_time_scale=args.time_scale, priors=priors,
    )  # fmt: skip
    try:
        result = simulate(trace, cfg)
    except (ValueError, RuntimeError) as exc:
        return fail(f"{args.trace}: {exc}")
    s = result.summary
    recorded = trace.mean_score()
    if args.json:
        print(json.dumps({**s.to_dict(), "recorded_score": recorded, "seed": args.seed}, indent=2))
    else:
        print(f"virtual replay of {args.trace} ({s.samples} samples, {s.steps} steps, {s.events} events "
              f"in {s.sim_wall_s:.2f}s)")  # fmt: skip
        print(f"  makespan        {s.makespan_s:12.1f} s")
        print(f"  lower bound     {s.lower_bound_s:12.1f} s  ({s.lb_binding}-bound; makespan/LB {s.lb_ratio:.3f}; "
              f"chain {s.lb_terms['chain']:.1f}, inference {s.lb_terms['inference']:.1f}, "
              f"environment {s.lb_terms['environment']:.1f})")  # fmt: skip
        print(f"  cache hit rate  {s.cache_hit_rate:12.3f}   recomputed tokens {s.recomputed_tokens:,}")
        print(f"  sample latency  p50 {s.p50_latency_s:.1f} s  p99 {s.p99_latency_s:.1f} s")
        print(f"  score           {s.mean_score:12.4f}   (recorded {recorded:.4f})")
        if s.router:
            print(f"  routing         {s.router}")
    return 0


def _live(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> int:
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import run_batch
    from agentbatch.flows.config import BatchConfig

    if args.engine == "openai":
        if not args.endpoint:
            return fail("--engine openai needs at least one --endpoint URL")
        engine: dict[str, Any] = {"inner": "openai", "endpoints": [
            {"name": f"worker-{i}", "base_url": url, "model": args.model} for i, url in enumerate(args.endpoint)
        ]}  # fmt: skip
    else:
        engine = {"inner": "timing", "workers": args.workers,
                  "timing": {"kind": "simulated", "profile": args.profile,
                             "time_scale": args.time_scale if args.time_scale > 0 else 1.0}}  # fmt: skip
    workload: dict[str, Any] = {"trace": str(args.trace.resolve()), "time_scale": args.time_scale}
    if args.samples is not None:
        workload["samples"] = args.samples
    config = BatchConfig.model_validate({
        "name": f"replay:{args.trace.name}",
        "workload": {"kind": "recorded", "params": workload},
        "engine": {"kind": "replay", "params": engine},
        "scheduling": {
            "max_active_samples": args.max_active, "env_slots": args.env_slots, "coupled": args.coupled,
            "per_worker_inflight": args.per_worker_inflight or 64,
            "router": {"name": args.router, "params": params["router"]},
            "env_queue": {"name": args.env_queue, "params": params["env_queue"]},
            "inference_queue": {"name": args.inference_queue, "params": params["inference_queue"]},
            "priority": {"name": args.priority, "params": params["priority"]},
        },
        "limits": {"max_steps": 100_000},
    })  # fmt: skip
    quiet_prefect_defaults()
    from agentbatch.traces import read_trace

    recorded = {s.index: s.score for s in read_trace(args.trace).samples}
    store = Store(args.db)
    try:
        batch_id = run_batch(config, store)
        samples = store.samples(batch_id)
        batch = store.get_batch(batch_id)
        url = store.url
    finally:
        store.close()
    same = sum(1 for s in samples if s.score == recorded.get(s.index))
    span = (batch.finished_at - batch.started_at) if batch and batch.finished_at and batch.started_at else 0.0
    print(f"live replay of {args.trace}: batch {batch_id} in {url}; wall {span:.1f}s; "
          f"scores equal to the recording: {same}/{len(samples)}; report with: agentbatch report {batch_id}")
    return 0 if same == len(samples) else 1
