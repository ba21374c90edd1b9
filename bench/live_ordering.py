"""Does the live runner confirm virtual time's ordering of the default policy vs the best baseline?

Per family (a scaled trace): virtual time replays it with the defaults and with the three strong
baselines (agentbatch/dashboards/baselines.py, as `replay` flags) and names the best baseline; then
the same two configs run live, through the Prefect batch flow (`replay --mode live`: recorded
environment, replay engine forced to the recorded output lengths) against two real-time `serve-sim`
workers, with engine speed and tool durations slowed by one time scale (so a live run takes about
--target-s). Prints both makespans per clock (live divided by the scale) and whether the ordering
matches (a ratio within 3 % of 1 counts as a tie). Helpers (serve-sim, health, ports) are bench/live_vs_virtual.py's.

The live runner spends time of its own on every step (the HTTP round trip and tokenizing of a
request, the store's commit, the gap until the sample's next step is queued): some milliseconds,
which a time scale that compresses steps 10-20x turns into a tenth of a virtual second or more, on
the critical path of every coupled chain. The bench measures it in the live runs (per step: service
time beyond what the engine reports or the recorded duration, plus the gap to the next step; one
mean over all steps of both runs, the same for both policies), and how far apart it starts the
sample chains (they start one after another: the median gap between the first steps of the samples
admitted at the start, over both runs), and replays virtual time again with both
(`VirtualConfig.step_latency_s`, `sample_start_s`); the verdict compares live with that prediction,
and the line also gives the prediction without them. A small batch's schedule can tip on a step's
timing (which chain the environment queue favours early decides when the longest one ends), so the
prediction is an ensemble: the measured latency x0.8/1/1.2, environment durations x0.995/1/1.005 and the start
spacing x0.5/1/2, paired for both policies; the verdict uses its median ratio and says whether every
member agrees.

The defaults get history priors (the chain lengths of the same tasks in another run of them, as
bench/robustness.py gives them; the baselines use none); `--no-history` runs them as a first run.

Usage: .venv/bin/python bench/live_ordering.py [--families mcp_like,swe_like] [--samples 16]
       [--target-s 40] [--env-slots 4] [--max-active 12] [--no-history]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    out = {"defaults": ["--max-active", str(args.max_active), "--env-slots", str(s), *args.history_flags]}
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


@dataclass
class LiveRun:
    makespan_s: float  # engine seconds (wall divided by the scale)
    overhead_wall_s: float  # summed over steps: the runner's own time (see step_overhead)
    steps: int
    start_gaps_wall_s: list[float]  # between the first steps of the samples admitted at the start (start_gaps)


def virtual_makespan(argv: list[str], profile: str, step_latency_s: float = 0.0, env_time_scale: float = 1.0,
                     sample_start_s: float = 0.0) -> float:
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import POLICY_KINDS, _params, _priors
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import read_trace

    a = build_parser().parse_args(argv)
    params = _params(a)
    cfg = VirtualConfig(workers=len(a.endpoint), profile=profile, max_active=a.max_active, env_slots=a.env_slots,
                        per_worker_inflight=a.per_worker_inflight, coupled=a.coupled,
                        admission_order=a.admission_order, admission_control=a.admission_control, priors=_priors(a),
                        step_latency_s=step_latency_s, env_time_scale=env_time_scale,
                        sample_start_s=sample_start_s, **{k: PolicySpec(getattr(a, k), params[k]) for k in POLICY_KINDS})  # fmt: skip
    return simulate(read_trace(Path(a.trace)), cfg).summary.makespan_s


def live_makespan(argv_at: object, profile: str, scale: float, db: str, recorded: dict[tuple[int, int], float]) -> LiveRun:
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
            steps = [s for s in store.steps(batch_id) if s.status == "completed"]
        finally:
            store.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    if any(s.status != "completed" for s in samples):
        raise RuntimeError("live replay: not every sample completed")
    span = max(s.finished_at for s in samples) - min(s.admitted_at for s in samples)
    index = {s.id: s.index for s in samples}
    return LiveRun(span / scale, step_overhead(steps, index, recorded, scale), len(steps), start_gaps(samples, steps))


def start_gaps(samples: list[Any], steps: list[Any]) -> list[float]:
    """Wall seconds between consecutive sample starts: the first steps of the samples that started
    before any sample finished, in the order they came."""
    first: dict[int, float] = {}
    for s in steps:
        first[s.sample_id] = min(first.get(s.sample_id, s.enqueued_at), s.enqueued_at)
    done = min(s.finished_at for s in samples)
    wave = sorted(t for t in first.values() if t < done)
    return [b - a for a, b in zip(wave, wave[1:], strict=False)]


def step_overhead(steps: list[Any], index: dict[int, int], recorded: dict[tuple[int, int], float],
                  scale: float) -> float:
    """The live runner's own wall time, summed over completed steps: an inference step's service beyond
    the engine's own time (its queue, prefill and decode, as it reports them), an environment step's
    beyond its recorded duration (times the scale), and each gap from a step's end to its sample's
    next step being queued. Policy-independent: no waiting for a slot is in it."""
    total = 0.0
    last: dict[int, Any] = {}
    for s in sorted(steps, key=lambda s: (s.sample_id, s.index)):
        service = s.finished_at - s.started_at
        if s.kind == "inference":
            own = (s.engine_queue_s or 0.0) + (s.prefill_s or 0.0) + (s.decode_s or 0.0)
        else:
            own = recorded[(index[s.sample_id], s.index)] * scale
        total += service - own
        prev = last.get(s.sample_id)
        if prev is not None:
            total += s.enqueued_at - prev.finished_at
        last[s.sample_id] = s
    return total


PROBE = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]  # endpoints only count workers in virtual time


def family_check(family: str, args: argparse.Namespace, tmp: Path) -> bool:
    from agentbatch.traces import FAMILIES, generate, write_trace

    profile = FAMILIES[family].capacities["profile"]
    path = tmp / f"{family}.parquet"
    trace = generate(family, args.samples, seed=args.seed)
    write_trace(trace, path)
    args.history_flags = []
    if not args.no_history:  # the defaults' priors: the same tasks' chain lengths in another run of them
        write_trace(generate(family, args.samples, seed=args.seed, epoch=1), tmp / f"{family}-history.parquet")
        args.history_flags = ["--priors", str(tmp / f"{family}-history.parquet")]
    recorded = {(s.index, st.index): st.duration_s or 0.0 for s in trace.samples for st in s.steps}
    flags = configs(args)

    def argv(name: str, urls: list[str], scale: float) -> list[str]:
        return argv_for(path, flags[name], urls, scale, profile)

    virt = {name: virtual_makespan(argv(name, PROBE, 1.0), profile) for name in flags}
    best = min((n for n in virt if n != "defaults"), key=lambda n: virt[n])
    scale = args.target_s / max(virt["defaults"], 1e-9)
    live: dict[str, LiveRun] = {}
    for name in ("defaults", best):
        t0 = time.perf_counter()
        live[name] = live_makespan(lambda urls, n=name: argv(n, urls, scale), profile, scale,
                                   f"sqlite:///{tmp / (family + str(len(live)) + '.sqlite')}", recorded)  # fmt: skip
        run = live[name]
        print(f"  {family} {name:36s} live {run.makespan_s:8.1f}s  (runner {run.overhead_wall_s / run.steps * 1e3:.1f} "
              f"ms/step; {time.perf_counter() - t0:.0f}s wall, load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    wall, start = runner_costs(list(live.values()), scale)
    ens = _ensemble({name: argv(name, PROBE, 1.0) for name in live}, profile, wall / scale, start)
    for name, run in live.items():
        at = statistics.median(ens[name])
        print(f"  {family} {name:36s} virtual {virt[name]:8.1f}s (live/virtual {run.makespan_s / virt[name]:.3f}); "
              f"with the runner's costs {at:8.1f}s [{min(ens[name]):.1f}-{max(ens[name]):.1f}] "
              f"(live/virtual {run.makespan_s / at:.3f})")  # fmt: skip
    ratios = [d / b for d, b in zip(ens["defaults"], ens[best], strict=True)]
    print(f"  {family} runner: {wall * 1e3:.1f} ms a step = {wall / scale:.3f} s virtual; samples start "
          f"{start * scale * 1e3:.1f} ms = {start:.3f} s virtual apart")
    return _report(family, args, scale, best, wall, ratios, {
        "plain": virt["defaults"] / virt[best], "live": live["defaults"].makespan_s / live[best].makespan_s})  # fmt: skip


def runner_costs(runs: list[LiveRun], scale: float) -> tuple[float, float]:
    """One step latency (wall seconds) and one start spacing (virtual seconds) for both policies,
    pooled over their live runs."""
    wall = sum(r.overhead_wall_s for r in runs) / sum(r.steps for r in runs)
    gaps = [g for r in runs for g in r.start_gaps_wall_s]
    return wall, (statistics.median(gaps) if gaps else 0.0) / scale


# (x step latency, x environment durations, x start spacing)
PERTURB = list(itertools.product((0.8, 1.0, 1.2), (0.995, 1.0, 1.005), (0.5, 1.0, 2.0)))


def _ensemble(argvs: dict[str, list[str]], profile: str, latency: float, start: float) -> dict[str, list[float]]:
    """Each policy's virtual makespans with the runner's measured costs, over the PERTURB members."""
    return {name: [virtual_makespan(a, profile, latency * k, e, start * j) for k, e, j in PERTURB]
            for name, a in argvs.items()}  # fmt: skip


def _report(family: str, args: argparse.Namespace, scale: float, best: str, wall: float, ensemble: list[float],
            ratio: dict[str, float]) -> bool:
    """The family's verdict line: the ensemble's median prediction with the measured step latency
    against live."""
    med = statistics.median(ensemble)
    v, l_ = _verdict(med), _verdict(ratio["live"])
    agree = "all members agree" if len({_verdict(r) for r in ensemble}) == 1 else "members disagree"
    match = v == l_ or v == "tie"  # a predicted tie confirms nothing either way
    prior = "no priors" if args.no_history else "defaults with history priors"
    print(f"## {family}: {args.samples} samples ({prior}), time scale {scale:.4f}; best baseline in virtual time: {best}; "
          f"step latency measured live {wall * 1e3:.1f} ms; defaults/best "
          f"virtual {ratio['plain']:.3f} ({_verdict(ratio['plain'])}), with the runner's costs {med:.3f} "
          f"[{min(ensemble):.3f}-{max(ensemble):.3f}, {agree}] ({v}), live {ratio['live']:.3f} ({l_}); "
          f"ordering matches: {match if v != 'tie' else 'n/a (tie predicted)'}; load {os.getloadavg()[0]:.1f}",
          flush=True)  # fmt: skip
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
    ap.add_argument("--no-history", action="store_true",
                    help="run the defaults without priors (a first run of the tasks); by default they get the "
                         "chain lengths of the same tasks in another run (epoch 1) as history priors")  # fmt: skip
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
