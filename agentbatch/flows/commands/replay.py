"""`agentbatch replay TRACE`: re-run a recorded batch with chosen policies and capacities.

--mode virtual (default): a discrete-event simulation in virtual time (simulated engine workers,
recorded environment durations); prints makespan, its lower bound, cache reuse, tail latency, score.
--mode live: a real batch through the Prefect flow: workload "recorded" (recorded observations after
the recorded durations) and engine "replay" (real inference forced to the recorded output lengths,
against --endpoint URLs or the simulated engine in real time); the batch lands in the store.

Both modes run the same scheduling core with the same defaults as `agentbatch run` (the
coordination policies). Every policy input is pinned by the flags: the admission order, and the
history priors, which come from --priors only (never from other batches in the store), so two
replays of one trace differ only in what the flags change. Scores of a replay equal the recording's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentbatch.flows.commands._common import DEFAULT_PROFILE, add_db_option, fail
from agentbatch.flows.commands._inputs import positive_float, positive_int
from agentbatch.scheduling.admission_order import ADMISSION_ORDERS
from agentbatch.scheduling.defaults import ADMISSION_CONTROLS, DEFAULTS

POLICY_KINDS = ("router", "env_queue", "inference_queue", "priority")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's line breaks and shows every default."""


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    from agentbatch.scheduling import registry

    g = p.add_argument_group("scheduling (defaults: those of `agentbatch run`)")
    g.add_argument("--max-active", type=positive_int, default=DEFAULTS.max_active_samples,
                   help="samples admitted at once (the reference concurrency; see `agentbatch plan`)")
    g.add_argument("--env-slots", type=positive_int, default=DEFAULTS.env_slots,
                   help="environment actions running at once")
    g.add_argument("--per-worker-inflight", type=positive_int, default=DEFAULTS.per_worker_inflight,
                   help="inference requests in flight per engine worker")
    g.add_argument("--coupled", action=argparse.BooleanOptionalAction, default=DEFAULTS.coupled,
                   help="baseline: a sample holds an environment slot while admitted")
    g.add_argument("--admission-order", choices=ADMISSION_ORDERS, default=DEFAULTS.admission_order,
                   help="as listed, or longest prior chain first (priors from --priors; none: as listed)")
    g.add_argument("--admission-control", choices=ADMISSION_CONTROLS, default=DEFAULTS.admission_control,
                   help="adaptive: the admission limit starts at --max-active and follows the engines' pressure; "
                   "static: it stays there")
    queues = " | ".join(sorted(registry.QUEUE_POLICIES))
    g.add_argument("--router", default=DEFAULTS.router, help="which engine worker serves a sample's next "
                   f"inference call: {' | '.join(sorted(registry.ROUTERS))}")
    g.add_argument("--env-queue", default=DEFAULTS.env_queue, help=f"order of the environment-action queue: {queues}")
    g.add_argument("--inference-queue", default=DEFAULTS.inference_queue,
                   help=f"order of each engine worker's queue: {queues}")
    g.add_argument("--priority", default=DEFAULTS.priority,
                   help=f"per-request engine priority: {' | '.join(sorted(registry.PRIORITIES))}")
    g.add_argument("--policy-param", action="append", default=[], metavar="WHAT.KEY=VALUE",
                   help="policy parameter (JSON value), WHAT in router, env_queue, inference_queue, priority; "
                   "e.g. router.balance_abs=16, env_queue.max_wait_s=300, priority.use_prior=true")
    g.add_argument("--policy", default="configured", metavar="NAME",
                   help="live mode: scheduling.policy: 'configured' (these flags, pinned), 'auto' (choose from the "
                   "policy portfolio by simulating it on earlier batches of these tasks in the store) or a "
                   "candidate's name (`agentbatch whatif --policy list`)")
    g.add_argument("--priors", type=Path, default=None,
                   help="an earlier trace of the same tasks: its chain lengths are the history priors "
                   "(caas_history, priority.use_prior, --admission-order longest_prior_first)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="replay a trace (virtual time or live) with chosen policies and capacities",
        description=__doc__, formatter_class=_HelpFormatter,
    )
    p.add_argument("trace", type=Path, help="trace file (.parquet; see `agentbatch trace`)")
    p.add_argument("--mode", choices=("virtual", "live"), default="virtual")
    p.add_argument("--engine", choices=("simulated", "openai"), default="simulated",
                   help="live mode: simulated engine in real time, or OpenAI-compatible --endpoint(s)")
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); repeat for more workers")
    p.add_argument("--model", default="default", help="model name sent to the endpoints")
    p.add_argument("--profile", default=None,
                   help=f"simulated engine profile (name or .json; default {DEFAULT_PROFILE}); live with --engine "
                   "openai: the endpoints' speed as that profile at --time-scale (a serve-sim pool, or a profile from "
                   "`agentbatch calibrate`), which --policy auto predicts with")
    p.add_argument("--workers", type=positive_int, default=2, help="simulated engine workers")
    p.add_argument("--inference", choices=("engine", "recorded"), default="engine",
                   help="virtual mode: inference on the engine model, or each call its recorded duration")
    p.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="multiply recorded environment durations (and, live with the simulated engine, its "
                   "speed: 0.1 runs ten times faster than real time)")
    p.add_argument("--samples", type=positive_int, default=None, help="replay only the first N samples (None: all)")
    p.add_argument("--seed", type=int, default=0,
                   help="recorded with the result; the replay itself is deterministic and draws no random numbers")
    p.add_argument("--json", action="store_true", help="virtual mode: print the summary as JSON")
    _add_policy_args(p)
    add_db_option(p)
    p.set_defaults(func=main)


def _params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {k: {} for k in POLICY_KINDS}
    for item in args.policy_param:
        key, sep, raw = item.partition("=")
        what, dot, name = key.partition(".")
        if not sep or not dot or what not in out or not name:
            raise ValueError(f"--policy-param {item!r}: expected WHAT.KEY=VALUE with WHAT in {sorted(out)}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[what][name] = value
    return out


def _unknown_policy(args: argparse.Namespace) -> str | None:
    from agentbatch.scheduling import registry

    tables: dict[str, Mapping[str, Any]] = {"router": registry.ROUTERS, "env_queue": registry.QUEUE_POLICIES,
              "inference_queue": registry.QUEUE_POLICIES, "priority": registry.PRIORITIES}  # fmt: skip
    for kind, table in tables.items():
        name = getattr(args, kind)
        if name not in table:
            return f"--{kind.replace('_', '-')}: unknown name {name!r}; expected one of {sorted(table)}"
    return None


def main(args: argparse.Namespace) -> int:
    problem = _unknown_policy(args)
    if problem:
        return fail(problem)
    try:
        params = _params(args)
    except ValueError as exc:
        return fail(str(exc))
    for path, what in ((args.trace, "trace"), (args.priors, "--priors")):
        if path is not None and not path.is_file():
            return fail(f"{what} {path}: no such trace file")
    if args.mode == "live" and args.engine == "openai" and not args.endpoint:
        return fail("--engine openai needs at least one --endpoint URL")
    if args.mode == "virtual":
        return _virtual(args, params)
    return _live(args, params)


def _priors(args: argparse.Namespace) -> dict[str, float]:
    """Chain-length priors from --priors only: pinned, whatever else the store holds."""
    from agentbatch.traces import chain_priors, read_trace

    return chain_priors(read_trace(args.priors)) if args.priors else {}


def _virtual(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> int:
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import read_trace

    trace = read_trace(args.trace)
    if args.samples is not None:
        trace.samples = trace.samples[: args.samples]
    spec = {k: PolicySpec(getattr(args, k), params[k]) for k in POLICY_KINDS}
    cfg = VirtualConfig(
        workers=args.workers, profile=args.profile or DEFAULT_PROFILE, max_active=args.max_active, env_slots=args.env_slots,
        per_worker_inflight=args.per_worker_inflight, coupled=args.coupled, admission_order=args.admission_order,
        admission_control=args.admission_control, env_time_scale=args.time_scale, priors=_priors(args), inference=args.inference,
        router=spec["router"], env_queue=spec["env_queue"], inference_queue=spec["inference_queue"],
        priority=spec["priority"],
    )  # fmt: skip
    try:
        result = simulate(trace, cfg)
    except (ValueError, TypeError, RuntimeError) as exc:
        return fail(f"{args.trace}: {exc}")
    if args.json:
        print(json.dumps({**result.summary.to_dict(), "recorded_score": trace.mean_score(), "seed": args.seed},
                         indent=2))  # fmt: skip
    else:
        _print_virtual(args.trace, result.summary, trace.mean_score())
    return 0


def _print_virtual(path: Path, s: Any, recorded: float) -> None:
    print(f"virtual replay of {path} ({s.samples} samples, {s.steps} steps, {s.events} events in {s.sim_wall_s:.2f}s)")
    print(f"  makespan        {s.makespan_s:12.1f} s")
    print(f"  lower bound     {s.lower_bound_s:12.1f} s  ({s.lb_binding}-bound; makespan/LB {s.lb_ratio:.3f}; "
          f"chain {s.lb_terms['chain']:.1f}, inference {s.lb_terms['inference']:.1f}, "
          f"environment {s.lb_terms['environment']:.1f})")  # fmt: skip
    print(f"  cache hit rate  {s.cache_hit_rate:12.3f}   recomputed tokens {s.recomputed_tokens:,}")
    print(f"  sample latency  p50 {s.p50_latency_s:.1f} s  p99 {s.p99_latency_s:.1f} s")
    print(f"  score           {s.mean_score:12.4f}   (recorded {recorded:.4f})")
    if s.router:
        print(f"  routing         {s.router}")


def live_batch_config(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> Any:
    """The BatchConfig of a live replay: every scheduling input from the flags (priors pinned)."""
    from agentbatch.environments.recorded import RecordedWorkload
    from agentbatch.flows.config import BatchConfig

    timing = {"kind": "simulated", "profile": args.profile or DEFAULT_PROFILE, "time_scale": args.time_scale}
    if args.engine == "openai":
        engine: dict[str, Any] = {"inner": "openai", "endpoints": [
            {"name": f"worker-{i}", "base_url": url, "model": args.model} for i, url in enumerate(args.endpoint)
        ]}  # fmt: skip
        if args.profile:  # the endpoints' speed, for predictions only
            engine["timing"] = timing
    else:
        engine = {"inner": "timing", "workers": args.workers, "timing": timing}
    workload: dict[str, Any] = {"trace": str(args.trace.resolve()), "time_scale": args.time_scale}
    if args.samples is not None:
        workload["samples"] = args.samples
    base = _priors(args)
    # The recorded workload names repeated task ids "id#k": each gets its base id's prior.
    tasks = RecordedWorkload(workload["trace"], time_scale=args.time_scale).tasks()
    priors = {t.task_id: base[t.data["task_id"]] for t in tasks if t.data["task_id"] in base}
    return BatchConfig.model_validate({
        "name": f"replay:{args.trace.name}",
        "workload": {"kind": "recorded", "params": workload},
        "engine": {"kind": "replay", "params": engine},
        "scheduling": {
            "max_active_samples": args.max_active, "env_slots": args.env_slots, "coupled": args.coupled,
            "per_worker_inflight": args.per_worker_inflight, "admission_order": args.admission_order,
            "admission_control": args.admission_control, "priors": priors, "policy": args.policy, **{k: {"name": getattr(args, k), "params": params[k]} for k in POLICY_KINDS},
        },
        "limits": {"max_steps": 100_000},
    })  # fmt: skip


def _live(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> int:
    from agentbatch.flows.commands._launch import ready_prefect, start_prefect

    try:
        config = live_batch_config(args, params)
    except ValueError as exc:
        return fail(str(exc))
    api = start_prefect()  # the same Prefect server as `run`, chosen before Prefect is imported
    if error := ready_prefect(api, quiet=True):
        return fail(error, code=1)
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import run_batch
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
