"""`agentbatch workers up|down|list`: start, stop and inspect real vLLM engine workers."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbatch.engines.vllm_workers import Endpoint, WorkerCluster, WorkersConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("workers", help="start, stop or list vLLM engine workers",
                              description="Start N vLLM OpenAI servers from a workers config (YAML, see "
                              "docs/vllm.md), stop them, or list the endpoints of a running cluster.")
    sub = p.add_subparsers(dest="workers_command", metavar="ACTION")

    up = sub.add_parser("up", help="start the workers of CONFIG and write their endpoints file")
    up.add_argument("config", help="workers config (YAML)")
    up.add_argument("--endpoints", help="endpoints file to write (default: the config's endpoints_file)")
    up.add_argument("--count", type=int, help="override the config's worker count")
    up.add_argument("--foreground", action="store_true",
                    help="stay in the foreground; Ctrl-C (or SIGTERM) stops the workers")
    up.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="stop the workers recorded in ENDPOINTS_FILE")
    down.add_argument("endpoints_file")
    down.add_argument("--timeout", type=float, default=30.0, help="SIGTERM grace before SIGKILL (s)")
    down.set_defaults(func=_down)

    ls = sub.add_parser("list", help="health and models of endpoints (URLs or an endpoints file)")
    ls.add_argument("targets", nargs="+", help="base URLs (http://host:port[/v1]) or endpoints files")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_list)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _up(args: argparse.Namespace) -> int:
    # vllm_workers is imported by the actions only: every other command's start-up skips it
    from agentbatch.engines.vllm_workers import WorkerCluster, WorkersError, load_workers_config

    try:
        cfg = load_workers_config(args.config)
    except WorkersError as exc:  # bad input: the message names the file and field
        print(f"error: {exc}", file=sys.stderr)
        return 2
    updates = {k: v for k, v in (("endpoints_file", args.endpoints), ("count", args.count)) if v}
    cfg = cfg.model_copy(update=updates)
    try:
        if args.dry_run:
            _print_commands(cfg)
            return 0
        cluster = WorkerCluster(cfg)
        print(f"starting {cfg.count} worker(s); logs in {cfg.log_dir}", flush=True)
        endpoints = cluster.up()
    except WorkersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; workers stopped", file=sys.stderr)
        return 130
    _print_started(cfg, cluster, endpoints)
    if not args.foreground:
        print(f"stop them with: agentbatch workers down {cfg.endpoints_file}")
        return 0
    _run_foreground(cluster)
    return 0


def _print_commands(cfg: WorkersConfig) -> None:
    from agentbatch.engines.vllm_workers import plan_launch

    for plan in plan_launch(cfg):
        env = " ".join(f"{k}={v}" for k, v in plan.env.items())
        print(f"# {plan.name} (log {plan.log_path})\n{env} {' '.join(plan.argv)}")


def _print_started(cfg: WorkersConfig, cluster: WorkerCluster, endpoints: list[Endpoint]) -> None:
    from agentbatch.engines.vllm_workers import load_plan

    for ep in endpoints:
        print(f"{ep.name}\t{ep.base_url}\t{ep.model}\tready in {cluster.ready_s[ep.name]:.1f} s")
    print(f"endpoints written to {cfg.endpoints_file}")
    if cfg.plan:
        n_ref = load_plan(cfg.plan).get("reference_concurrency")
        if n_ref:
            print(f"resource model: reference concurrency {n_ref} -> scheduling.max_active_samples: {n_ref}")


def _run_foreground(cluster: WorkerCluster) -> None:
    """Until Ctrl-C / SIGTERM or a worker exits; then stop them all."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    print("running in the foreground; Ctrl-C stops the workers", flush=True)
    while not stop.wait(1.0):
        dead = [w.name for w in cluster.workers if cluster._procs[w.name].poll() is not None]
        if dead:
            print(f"worker(s) exited: {', '.join(dead)}; stopping the rest", file=sys.stderr)
            break
    result = cluster.down()
    print("; ".join(f"{k}: {v}" for k, v in result.items()))


def _down(args: argparse.Namespace) -> int:
    from agentbatch.engines.vllm_workers import WorkersError, down_from_file

    try:
        result = down_from_file(args.endpoints_file, args.timeout)
    except WorkersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, what in result.items():
        print(f"{name}\t{what}")
    return 0


def _probe_target(target: str) -> list[dict[str, Any]]:
    """Probe rows of a URL or of every endpoint of an endpoints file (raises on an unreadable file)."""
    from agentbatch.engines.vllm_workers import probe, read_endpoints

    if target.startswith(("http://", "https://")):
        return [{"name": target, **probe(target)}]
    return [{"name": ep.name, **probe(ep.base_url)} for ep in read_endpoints(target)]


def _list(args: argparse.Namespace) -> int:
    rows = []
    for target in args.targets:
        try:
            rows += _probe_target(target)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            print(f"error: {target}: not a URL nor a readable endpoints file ({exc})", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            state = "healthy" if r["healthy"] else "DOWN"
            models = ",".join(m for m in r["models"] if m) or "-"
            print(f"{r['name']}\t{r['base_url']}\t{state}\t{models}" + (f"\t{r['error']}" if r["error"] else ""))
    return 0 if all(r["healthy"] for r in rows) else 1
