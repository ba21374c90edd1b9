"""Does the live runner confirm virtual time's ordering of the default policy vs the best baseline?

Per family (a scaled trace): virtual time replays it with the defaults and with the three strong
baselines (agentbatch/dashboards/baselines.py, as `replay` flags) and names the best baseline; then
the same two configs run live, through the Prefect batch flow (`replay --mode live`: recorded
environment, replay engine forced to the recorded output lengths) against two real-time `serve-sim`
workers, with engine speed and tool durations slowed by one time scale (so a live run takes about
--target-s). Prints both makespans per clock (live divided by the scale) and whether the ordering
matches (a ratio within 3 % of 1 counts as a tie). Helpers (serve-sim, health, ports) are bench/live_vs_virtual.py's.

Usage: .venv/bin/python bench/live_ordering.py [--families mcp_like,swe_like] [--samples 16]
       [--target-s 40] [--env-slots 4] [--max-active 12]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import live_vs_virtual as lvv  # noqa: E402

from agentbatch.flows.prefect_server import choose_api, stop_server, wait_ready  # noqa: E402

TIE = 0.03
STATIC = ["--admission-control", "static", "--admission-order", "arrival", "--env-queue", "fifo",
          "--inference-queue", "fifo", "--priority", "fcfs"]  # fmt: skip


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    """replay flags of the defaults and the baselines (coupled limits as dashboards/baselines.py)."""
    from agentbatch.dashboards.baselines import COUPLED_BEST, COUPLED_PAPER, FIFO_ALL, coupled_limits

    s = args.env_slots
    out = {"defaults": ["--max-active", str(args.max_active), "--env-slots", str(s)]}
    for n in coupled_limits(s):
        out[f"{COUPLED_BEST} (limit {n})"] = ["--coupled", "--max-active", str(n), "--env-slots", str(s),
                                               "--router", "trajectory_aware", *STATIC]  # fmt: skip
    out[FIFO_ALL] = ["--max-active", str(args.samples), "--env-slots", str(s), "--router", "trajectory_aware", *STATIC]
    out[COUPLED_PAPER] = ["--coupled", "--max-active", str(s), "--env-slots", str(s), "--router", "round_robin", *STATIC]
    return out


def argv_for(trace: Path, flags: list[str], urls: list[str], scale: float, profile: str) -> list[str]:
    argv = ["replay", str(trace), "--mode", "live", "--engine", "openai", "--model", profile,
            "--time-scale", f"{scale:.6f}", *flags]  # fmt: skip
    for url in urls:
        argv += ["--endpoint", url]
    return argv


def virtual_makespan(argv: list[str], profile: str) -> float:
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import POLICY_KINDS, _params
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import read_trace

    a = build_parser().parse_args(argv)
    params = _params(a)
    cfg = VirtualConfig(workers=len(a.endpoint), profile=profile, max_active=a.max_active, env_slots=a.env_slots,
                        per_worker_inflight=a.per_worker_inflight, coupled=a.coupled,
                        admission_order=a.admission_order, admission_control=a.admission_control, priors={},
                        **{k: PolicySpec(getattr(a, k), params[k]) for k in POLICY_KINDS})  # fmt: skip
    return simulate(read_trace(Path(a.trace)), cfg).summary.makespan_s


def live_makespan(argv_at: object, profile: str, scale: float, db: str) -> float:
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import run_batch
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import _params, live_batch_config

    ports = lvv._free_ports(2)
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    procs = [lvv.serve_sim(profile, scale, p, f"sim-{i}") for i, p in enumerate(ports)]
    try:
        for url in urls:
            lvv.wait_health(url)
        a = build_parser().parse_args(argv_at(urls))  # type: ignore[operator]
        store = Store(db)
        try:
            batch_id = run_batch(live_batch_config(a, _params(a)), store, show_progress=False)
            samples = store.samples(batch_id)
        finally:
            store.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    if any(s.status != "completed" for s in samples):
        raise RuntimeError("live replay: not every sample completed")
    return (max(s.finished_at for s in samples) - min(s.admitted_at for s in samples)) / scale


def family_check(family: str, args: argparse.Namespace, tmp: Path) -> bool:
    from agentbatch.traces import FAMILIES, generate, write_trace

    profile = FAMILIES[family].capacities["profile"]
    path = tmp / f"{family}.parquet"
    write_trace(generate(family, args.samples, seed=args.seed), path)
    probe = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    flags = configs(args)
    virt = {name: virtual_makespan(argv_for(path, f, probe, 1.0, profile), profile) for name, f in flags.items()}
    best = min((n for n in virt if n != "defaults"), key=lambda n: virt[n])
    scale = args.target_s / max(virt["defaults"], 1e-9)
    live = {}
    for name in ("defaults", best):
        t0 = time.perf_counter()
        live[name] = live_makespan(lambda urls, f=flags[name]: argv_for(path, f, urls, scale, profile), profile, scale,
                                   f"sqlite:///{tmp / (family + str(len(live)) + '.sqlite')}")  # fmt: skip
        print(f"  {family} {name:36s} live {live[name]:8.1f}s  virtual {virt[name]:8.1f}s  "
              f"live/virtual {live[name] / virt[name]:.3f}  ({time.perf_counter() - t0:.0f}s wall)", flush=True)
    v, l_ = virt["defaults"] / virt[best], live["defaults"] / live[best]
    match = _verdict(v) == _verdict(l_) or _verdict(v) == "tie"  # a predicted tie confirms nothing either way
    print(f"## {family}: {args.samples} samples, time scale {scale:.4f}; best baseline in virtual time: {best}; "
          f"defaults/best virtual {v:.3f} ({_verdict(v)}), live {l_:.3f} ({_verdict(l_)}); ordering matches: "
          f"{match if _verdict(v) != 'tie' else 'n/a (tie predicted)'}; load {os.getloadavg()[0]:.1f}", flush=True)
    return match


def _verdict(ratio: float) -> str:
    """Within TIE of 1: a tie (live runs on a shared machine jitter by a few per cent)."""
    return "tie" if abs(ratio - 1.0) < TIE else ("defaults faster" if ratio < 1.0 else "baseline faster")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="mcp_like,swe_like", help="comma-separated (default mcp_like,swe_like)")
    ap.add_argument("--samples", type=int, default=16, help="samples per family (default 16)")
    ap.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    ap.add_argument("--target-s", type=float, default=40.0, help="wall seconds a live run should take (default 40)")
    ap.add_argument("--env-slots", type=int, default=4, help="environment slots S (default 4)")
    ap.add_argument("--max-active", type=int, default=12, help="the defaults' admission limit (default 12)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="live-ordering-"))
    os.environ["AGENTBATCH_HOME"] = str(tmp)  # a Prefect server of this run only
    api = choose_api(start=True)
    if api.source == "started":
        wait_ready(api)
    print(f"# {api.describe()}; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    try:
        matches = [family_check(f, args, tmp) for f in args.families.split(",") if f]
    finally:
        if api.source == "started":
            stop_server()
    print(f"live ordering of defaults vs best baseline matches virtual time: {sum(matches)} of {len(matches)} families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
