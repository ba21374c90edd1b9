"""`scheduling.policy: auto` through the gateway, live: the choice against the strong baselines, each
run live through `agentbatch gateway`, and every run against its virtual-time prediction.

One recorded workload (a family's trace, gateway_makespan.py's plain loop on the `openai` SDK and an
MCP client: each request asks for the recorded output tokens, each tool call sleeps the recorded
time on an MCP server behind the tool gateway) is driven by a harness that keeps at most --harness
samples open at once, in their order. One gateway batch per run, all named alike in one SQLite
store (the suite's history), fresh simulated workers (`serve-sim`) each:

1. each strong baseline pinned (`scheduling.policy: NAME`): coupled at S/4, S/2 and S (the sweep:
   its best is the baseline), decoupled FIFO with every sample admitted, the paper's coupled;
2. `policy: auto`, which simulates the portfolio on the latest three finished batches of the name
   (the last three baselines' records) with the samples sent as the harness sends them, runs the
   one the rule picks, and re-plans at checkpoints as the samples arrive (what it did is printed).

Per run it prints the live makespan and the prediction of the same configuration on that run's own
record (virtual time with the harness's window and the runner's measured costs, scaled to wall
seconds: flows/policy_choice.py `engine_base`; a run that switched, with its switches at the same
checkpoints), and at the end the choice's live makespan against
the best baseline's live makespan.

    .venv/bin/python bench/gateway_choice.py [--family mcp_like] [--samples 24] [--harness 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from gateway_makespan import drive, probe_server
from gateway_overhead import MODEL, free_port, process, sim_worker
from live_ordering import switched_makespan

from agentbatch.db.store import Store
from agentbatch.db.trace_io import export_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.policy_choice import engine_base
from agentbatch.scheduling.portfolio import Candidate
from agentbatch.sim.portfolio import candidate_config, portfolio
from agentbatch.sim.virtual_time import VirtualBatch
from agentbatch.traces import chain_priors, generate, get_family

NAME = "bench-gateway-choice"
BASELINES = ("coupled at S*0.25", "coupled at S*0.5", "coupled at S*1", "coupled at slots (paper)",
             "decoupled FIFO, all admitted")  # the last three are auto's history


def gateway_config(args: argparse.Namespace, caps: dict[str, Any], workers: dict[str, str], policy: str) -> dict:
    timing = {"kind": "simulated", "profile": args.profile, "time_scale": args.time_scale}
    return {"name": NAME, "engine": {"kind": "openai", "params": {"timing": timing, "endpoints": [
        {"name": n, "base_url": u, "model": MODEL} for n, u in workers.items()]}},
        "scheduling": {"policy": policy, "max_active_samples": caps["max_active"], "env_slots": caps["env_slots"],
                       "per_worker_inflight": args.per_worker_inflight}}  # fmt: skip


@contextlib.contextmanager
def gateway(tmp: Path, db: str, config: dict, mcp: str) -> Iterator[str]:
    """`agentbatch gateway` with `config`; yields its base URL. SIGTERM at the end finishes the batch."""
    port = free_port()
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["-m", "agentbatch.flows.cli", "gateway", "--config", str(path), "--port", str(port), "--db", db,
            "--no-prefect", "--no-progress", "--mcp", f"probe={mcp}"]
    with process(argv, f"http://127.0.0.1:{port}/health", tmp / "gateway.log"):
        yield f"http://127.0.0.1:{port}"


def run(samples: list[Any], args: argparse.Namespace, caps: dict[str, Any], tmp: Path, db: str,
        policy: str) -> tuple[float, int]:
    """One live gateway batch; its makespan (harness wall seconds) and batch id."""
    mode = tmp / f"run-{len(list(tmp.iterdir()))}"
    mode.mkdir()
    with contextlib.ExitStack() as stack:
        workers = {f"w{i}": stack.enter_context(sim_worker(mode, f"w{i}", args.time_scale, args.profile))
                   for i in range(caps["workers"])}
        probe = stack.enter_context(probe_server(mode))
        gw = stack.enter_context(gateway(mode, db, gateway_config(args, caps, workers, policy), probe))
        makespan = asyncio.run(drive(samples, list(workers.values()), gw + "/mcp", args.env_scale, gateway_url=gw,
                                     env_slots=caps["env_slots"], window=args.harness))
    # the batch ends when the gateway process does (SIGTERM above)
    store = Store(db)
    try:
        return makespan, store.list_batches()[-1].id
    finally:
        store.close()


def predicted(store: Store, batch_id: int, cand: Candidate, args: argparse.Namespace,
              switches: tuple[dict[str, Any], ...] = ()) -> float:
    """The candidate's makespan predicted on the batch's own record, in wall seconds; with the live
    run's re-planning switches made at the same checkpoints."""
    trace = export_batch(store, batch_id)
    config = BatchConfig.model_validate(trace.meta["config"])
    base = replace(engine_base(config, len(config.engine.params["endpoints"]), [trace]), harness=args.harness)
    cfg = candidate_config(cand, base, samples=len(trace.samples), n_ref=config.scheduling.max_active_samples,
                           priors=chain_priors(trace))
    if switches:
        return switched_makespan(trace, cfg, switches, config.scheduling.max_active_samples) * args.time_scale
    return VirtualBatch(trace, cfg).run().makespan_s * args.time_scale


def replanned(choice: dict[str, Any]) -> str:
    """What re-planning did while the batch ran (the stored choice's `replan` and `switches`)."""
    done = choice.get("replan") or {}
    moves = ", ".join(f"at {sw['at_wall_s']:.1f} s {sw['from']} -> {sw['to']} (remainder predicted x{sw['predicted_ratio']})"
                      for sw in choice.get("switches") or ())
    return (f"re-planning: {done.get('checkpoints', 0)} checkpoint(s), {done.get('simulations', 0)} simulations, "
            f"{done.get('cpu_s', 0):.2f} s CPU; {moves or 'no switch'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="mcp_like")
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--harness", type=int, default=8, help="samples the harness keeps open at once")
    parser.add_argument("--profile", default=None, help="simulated worker profile (default: the family's)")
    parser.add_argument("--time-scale", type=float, default=0.25, help="wall seconds per engine second")
    parser.add_argument("--env-scale", type=float, default=0.25, help="factor on recorded tool times")
    parser.add_argument("--env-slots", type=int, default=None, help="environment slots (default: the family's)")
    parser.add_argument("--max-active", type=int, default=None, help="N_ref, the admission limit (default: the family's)")
    parser.add_argument("--per-worker-inflight", type=int, default=64)
    args = parser.parse_args()
    caps = dict(get_family(args.family).capacities)
    caps.update({k: v for k, v in (("env_slots", args.env_slots), ("max_active", args.max_active)) if v})
    args.profile = args.profile or caps["profile"]
    samples = generate(args.family, args.samples, seed=args.seed).samples
    by_name = {c.name: c for c in portfolio()}
    print(f"# {args.samples} samples of {args.family} (seed {args.seed}), harness {args.harness} at once; "
          f"{caps['workers']} serve-sim workers ({args.profile}, time scale {args.time_scale}), tools x {args.env_scale}, "
          f"{caps['env_slots']} environment slots, N_ref {caps['max_active']}; load {os.getloadavg()[0]:.1f}")
    live: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="agentbatch-gw-choice-") as name:
        tmp = Path(name)
        db = f"sqlite:///{tmp / 'store.sqlite'}"
        for policy in (*BASELINES, "auto"):
            t0 = time.perf_counter()
            makespan, batch_id = run(samples, args, caps, tmp, db, policy)
            store = Store(db)
            scheduling = store.get_batch(batch_id).config["scheduling"]
            choice = scheduling.get("choice") or {}
            chosen = choice.get("chosen", scheduling["policy"])
            switches = tuple(choice.get("switches") or ())
            pred = predicted(store, batch_id, by_name[chosen], args, switches)
            store.close()
            live[policy] = makespan
            extra = ""
            if policy == "auto":
                extra = (f"; chose {chosen!r} ({choice.get('simulations')} simulations on {choice.get('members')} "
                         f"earlier runs, harness {choice.get('harness')}, {choice.get('decide_s')} s); {replanned(choice)}")
            print(f"{policy:30s} live {makespan:7.1f} s  predicted {pred:7.1f} s  live/predicted {makespan / pred:.3f}  "
                  f"({time.perf_counter() - t0:.0f} s){extra}; load {os.getloadavg()[0]:.1f}", flush=True)
    coupled = min(BASELINES[:3], key=lambda n: live[n])
    best = min(BASELINES, key=lambda n: live[n])
    print(f"policy auto live x{live['auto'] / live[best]:.3f} of the best baseline live ({best}); coupled sweep's best "
          f"{coupled}; machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
