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

`--policy auto` checks the choice the way a user meets it: `--history-runs` earlier runs of the same
tasks (epochs 1.., the defaults without priors) run live into one store, then the batch runs live
with `--policy auto` on that store (it simulates the policy portfolio on those runs, with the
workers described by `--profile`, and runs its choice), then live every baseline predicted within
10 % of the best in virtual time, and the defaults when the choice is not adaptive admission
starting below the batch's samples. Met per family: the choice live within 2 % of the best
baseline's live makespan, and every live run within 5 % of its prediction with the runner's costs.

Usage: .venv/bin/python bench/live_ordering.py [--families mcp_like,swe_like] [--samples 16]
       [--target-s 40] [--env-slots 4] [--max-active 12] [--no-history] [--policy auto]
       [--history-runs 3]
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
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import live_vs_virtual as lvv  # noqa: E402

from agentbatch.flows.prefect_server import choose_api, stop_server, wait_ready  # noqa: E402

TIE = 0.03
TARGET = 1.02  # policy auto: its live makespan at most this multiple of the best baseline's live
WITHIN = 0.05  # policy auto: every live run within this fraction of its prediction with the runner's costs
LIVE_BASELINES = 1.10  # policy auto: the baselines run live, predicted within this multiple of the best
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
    scheduling: dict[str, Any]  # the stored config's scheduling section (policy auto's choice in it)
    peak_admitted: int  # the most samples admitted at once


def virtual_makespan(argv: list[str], profile: str, step_latency_s: float = 0.0, env_time_scale: float = 1.0,
                     sample_start_s: float = 0.0, candidate: str | None = None,
                     switches: tuple[dict[str, Any], ...] = ()) -> float:
    """The replay's makespan in virtual time; with `candidate`, that portfolio candidate's (as policy
    auto simulates and runs it: N_ref = the flags' admission limit, the flags' priors), switched to
    another at each checkpoint where the live run re-planned (`switches`: the stored choice's)."""
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import POLICY_KINDS, _params, _priors
    from agentbatch.sim.portfolio import candidate_config, portfolio
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import read_trace

    a = build_parser().parse_args(argv)
    params = _params(a)
    trace = read_trace(Path(a.trace))
    cfg = VirtualConfig(workers=len(a.endpoint), profile=profile, max_active=a.max_active, env_slots=a.env_slots,
                        per_worker_inflight=a.per_worker_inflight, coupled=a.coupled,
                        admission_order=a.admission_order, admission_control=a.admission_control, priors=_priors(a),
                        step_latency_s=step_latency_s, env_time_scale=env_time_scale,
                        sample_start_s=sample_start_s, **{k: PolicySpec(getattr(a, k), params[k]) for k in POLICY_KINDS})  # fmt: skip
    if candidate is not None:
        cand = next(c for c in portfolio() if c.name == candidate)
        cfg = candidate_config(cand, cfg, samples=len(trace.samples), n_ref=a.max_active, priors=cfg.priors)
    if switches:
        return switched_makespan(trace, cfg, switches, a.max_active)
    return simulate(trace, cfg).summary.makespan_s


def switched_makespan(trace: Any, cfg: Any, switches: tuple[dict[str, Any], ...], n_ref: int) -> float:
    """The batch in virtual time with the live run's switches made at the same checkpoints."""
    from agentbatch.sim.portfolio import Member, portfolio
    from agentbatch.sim.replan import apply
    from agentbatch.sim.virtual_time import VirtualBatch
    from agentbatch.sim.virtual_time.simulation import Checkpoints

    every_s = switches[0]["at_s"] / switches[0]["checkpoint"]
    to = {sw["checkpoint"]: next(c for c in portfolio() if c.name == sw["to"]) for sw in switches}
    seen = [0]

    def checkpoint(batch: Any, now: float) -> None:
        seen[0] += 1
        if seen[0] in to:
            apply(batch, to[seen[0]], now, Member(trace, cfg.priors), n_ref)

    batch = VirtualBatch(trace, cfg)
    batch.checkpoints = Checkpoints(every_s, checkpoint)
    return batch.run().makespan_s


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
            scheduling = dict(store.get_batch(batch_id).config["scheduling"])
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
    return LiveRun(span / scale, step_overhead(steps, index, recorded, scale), len(steps), start_gaps(samples, steps),
                   scheduling, peak_admitted(samples))  # fmt: skip


def peak_admitted(samples: list[Any]) -> int:
    """The most samples admitted at once (admission to finish)."""
    events = sorted([(s.admitted_at, 1) for s in samples] + [(s.finished_at, -1) for s in samples])
    return max(itertools.accumulate(d for _, d in events))


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


@dataclass
class Family:
    """A family's batch (epoch 0 of the trace seed) and its history (the same tasks, epoch 1), as files."""

    name: str
    profile: str
    path: Path
    history: list[Path]  # epochs 1, 2, ...: the first gives the defaults' priors
    flags: dict[str, list[str]]  # replay flags of the defaults and the baselines (configs)
    tmp: Path

    def argv(self, name: str, urls: list[str], scale: float, extra: tuple[str, ...] = ()) -> list[str]:
        return argv_for(self.path, [*self.flags[name], *extra], urls, scale, self.profile)


def prepare(family: str, args: argparse.Namespace, tmp: Path) -> Family:
    from agentbatch.traces import FAMILIES, generate, write_trace

    epochs = range(1, 1 + max(1, args.history_runs))
    fam = Family(family, FAMILIES[family].capacities["profile"], tmp / f"{family}.parquet",
                 [tmp / f"{family}-history{e}.parquet" for e in epochs], {}, tmp)  # fmt: skip
    write_trace(generate(family, args.samples, seed=args.seed), fam.path)
    for e, path in zip(epochs, fam.history, strict=True):
        write_trace(generate(family, args.samples, seed=args.seed, epoch=e), path)
    # the defaults' priors: the same tasks' chain lengths in another run of them
    args.history_flags = [] if args.no_history else ["--priors", str(fam.history[0])]
    fam.flags = configs(args)
    return fam


def recorded_durations(path: Path) -> dict[tuple[int, int], float]:
    from agentbatch.traces import read_trace

    return {(s.index, st.index): st.duration_s or 0.0 for s in read_trace(path).samples for st in s.steps}


def run_live(fam: Family, label: str, argv_at: Any, scale: float, db: str, recorded: dict[tuple[int, int], float]) -> LiveRun:
    t0 = time.perf_counter()
    run = live_makespan(argv_at, fam.profile, scale, db, recorded)
    print(f"  {fam.name} {label:36s} live {run.makespan_s:8.1f}s  (runner {run.overhead_wall_s / run.steps * 1e3:.1f} "
          f"ms/step; peak admitted {run.peak_admitted}; {time.perf_counter() - t0:.0f}s wall, load "
          f"{os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    return run


def family_check(family: str, args: argparse.Namespace, tmp: Path) -> bool:
    fam = prepare(family, args, tmp)
    virt = {name: virtual_makespan(fam.argv(name, PROBE, 1.0), fam.profile) for name in fam.flags}
    best = min((n for n in virt if n != "defaults"), key=lambda n: virt[n])
    scale = args.target_s / max(virt["defaults"], 1e-9)
    if args.policy == "auto":
        return auto_check(fam, args, virt, scale)
    recorded = recorded_durations(fam.path)
    live = {name: run_live(fam, name, lambda urls, n=name: fam.argv(n, urls, scale), scale,
                           f"sqlite:///{tmp / (family + str(i) + '.sqlite')}", recorded)
            for i, name in enumerate(("defaults", best))}  # fmt: skip
    wall, start = runner_costs(list(live.values()), scale)
    ens = _ensemble({name: partial(virtual_makespan, fam.argv(name, PROBE, 1.0), fam.profile) for name in live},
                    wall / scale, start)  # fmt: skip
    _print_predictions(fam.name, {n: (r, virt[n]) for n, r in live.items()}, ens)
    ratios = [d / b for d, b in zip(ens["defaults"], ens[best], strict=True)]
    print(f"  {family} runner: {wall * 1e3:.1f} ms a step = {wall / scale:.3f} s virtual; samples start "
          f"{start * scale * 1e3:.1f} ms = {start:.3f} s virtual apart")
    return _report(family, args, scale, best, wall, ratios, {
        "plain": virt["defaults"] / virt[best], "live": live["defaults"].makespan_s / live[best].makespan_s})  # fmt: skip


def _print_predictions(family: str, runs: dict[str, tuple[LiveRun, float]], ens: dict[str, list[float]]) -> None:
    for name, (run, plain) in runs.items():
        at = statistics.median(ens[name])
        print(f"  {family} {name:36s} virtual {plain:8.1f}s (live/virtual {run.makespan_s / plain:.3f}); "
              f"with the runner's costs {at:8.1f}s [{min(ens[name]):.1f}-{max(ens[name]):.1f}] "
              f"(live/virtual {run.makespan_s / at:.3f})")  # fmt: skip


def auto_check(fam: Family, args: argparse.Namespace, virt: dict[str, float], scale: float) -> bool:
    """policy auto live: earlier live runs of the same tasks (the history: epochs 1.., the defaults as
    configured, no priors) in the store, then the batch with `--policy auto` on the same store (it simulates the
    portfolio on that history and runs its choice), then live every baseline predicted within
    LIVE_BASELINES of the best one, and the defaults when the choice is not adaptive admission
    starting below the batch's samples (where the controller acts). Met: the chosen policy live within TARGET of the best baseline
    live, and every live run within WITHIN of its prediction with the runner's costs."""
    db = f"sqlite:///{fam.tmp / (fam.name + '-auto.sqlite')}"
    plain = ["--max-active", str(args.max_active), "--env-slots", str(args.env_slots)]
    for i, path in enumerate(fam.history):
        run_live(fam, f"history run {i + 1} (defaults, no priors)", lambda urls, p=path: argv_for(p, plain, urls, scale, fam.profile),
                 scale, db, recorded_durations(path))  # fmt: skip
    recorded = recorded_durations(fam.path)
    auto = run_live(fam, "policy auto", lambda urls: fam.argv("defaults", urls, scale, ("--policy", "auto", "--profile", fam.profile)),
                    scale, db, recorded)  # fmt: skip
    choice = auto.scheduling.get("choice") or {}
    chosen = choice.get("chosen", "configured")
    print(f"  {fam.name} policy auto chose {chosen!r}: {choice.get('reason') or _choice_line(choice)}", flush=True)
    print(f"  {fam.name} policy auto re-planning: {_replan_line(choice)}", flush=True)
    if chosen == "configured":
        return False
    best = min((n for n in virt if n != "defaults"), key=lambda n: virt[n])
    others = sorted((n for n in virt if n != "defaults" and virt[n] <= LIVE_BASELINES * virt[best]), key=virt.get)  # baselines
    live = {"policy auto": auto}
    if not _controller_acts(auto.scheduling, args.samples):  # adaptive admission below the batch, where it acts
        others.append("defaults")
    for i, name in enumerate(others):
        live[name] = run_live(fam, name, lambda urls, n=name: fam.argv(n, urls, scale), scale,
                              f"sqlite:///{fam.tmp / (fam.name + '-b' + str(i) + '.sqlite')}", recorded)  # fmt: skip
    wall, start = runner_costs(list(live.values()), scale)
    defaults = fam.argv("defaults", PROBE, 1.0)
    switches = tuple(choice.get("switches") or ())
    predictors = {"policy auto": partial(virtual_makespan, defaults, fam.profile, candidate=chosen, switches=switches),
                  **{n: partial(virtual_makespan, fam.argv(n, PROBE, 1.0), fam.profile) for n in others}}  # fmt: skip
    ens = _ensemble(predictors, wall / scale, start)
    plain_virt = {"policy auto": virtual_makespan(defaults, fam.profile, candidate=chosen, switches=switches), **virt}
    _print_predictions(fam.name, {n: (r, plain_virt[n]) for n, r in live.items()}, ens)
    return _auto_report(fam.name, args, chosen, live, ens)


def _replan_line(choice: dict[str, Any]) -> str:
    done = choice.get("replan") or {}
    moves = ", ".join(f"checkpoint {sw['checkpoint']} ({sw['at_s']:.0f} s virtual): {sw['from']!r} -> {sw['to']!r} "
                      f"(remainder predicted x{sw['predicted_ratio']})" for sw in choice.get("switches") or ())
    return (f"{done.get('checkpoints', 0)} checkpoint(s) every {done.get('every_s', 0):.1f} s virtual, "
            f"{done.get('simulations', 0)} simulations, {done.get('cpu_s', 0):.2f} s CPU; {moves or 'no switch'}")


def _controller_acts(scheduling: dict[str, Any], samples: int) -> bool:
    return scheduling.get("admission_control") == "adaptive" and int(scheduling["max_active_samples"]) < samples


def _choice_line(choice: dict[str, Any]) -> str:
    return (f"score {choice.get('score')} vs best baseline {choice.get('fallback')!r} {choice.get('fallback_score')}; "
            f"{choice.get('simulations')} simulations in {choice.get('decide_s')} s")  # fmt: skip


def _auto_report(family: str, args: argparse.Namespace, chosen: str, live: dict[str, LiveRun],
                 ens: dict[str, list[float]]) -> bool:
    auto = live["policy auto"]
    best = min((n for n in live if n not in ("policy auto", "defaults")), key=lambda n: live[n].makespan_s)
    ratio = auto.makespan_s / live[best].makespan_s
    errors = {n: r.makespan_s / statistics.median(ens[n]) for n, r in live.items()}
    within = all(abs(e - 1.0) <= WITHIN for e in errors.values())
    limit = auto.scheduling.get("max_active_samples")
    print(f"## {family}: policy auto chose {chosen!r} (admission {auto.scheduling.get('admission_control')}, limit "
          f"{limit} of {args.samples} samples, N_ref {args.max_active}, peak admitted {auto.peak_admitted}); live x{ratio:.3f} "
          f"of the best baseline live ({best}) (target <= {TARGET}: {'met' if ratio <= TARGET else 'not met'}); "
          f"live/virtual with the runner's costs: {', '.join(f'{n} {e:.3f}' for n, e in errors.items())} "
          f"(within {WITHIN:.0%}: {'met' if within else 'not met'}); load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return ratio <= TARGET and within


def runner_costs(runs: list[LiveRun], scale: float) -> tuple[float, float]:
    """One step latency (wall seconds) and one start spacing (virtual seconds) for both policies,
    pooled over their live runs."""
    wall = sum(r.overhead_wall_s for r in runs) / sum(r.steps for r in runs)
    gaps = [g for r in runs for g in r.start_gaps_wall_s]
    return wall, (statistics.median(gaps) if gaps else 0.0) / scale


# (x step latency, x environment durations, x start spacing)
PERTURB = list(itertools.product((0.8, 1.0, 1.2), (0.995, 1.0, 1.005), (0.5, 1.0, 2.0)))


def _ensemble(predictors: dict[str, Any], latency: float, start: float) -> dict[str, list[float]]:
    """Each policy's virtual makespans with the runner's measured costs, over the PERTURB members
    (a predictor: virtual_makespan with its argv, profile and candidate bound)."""
    return {name: [f(latency * k, e, start * j) for k, e, j in PERTURB] for name, f in predictors.items()}


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
    ap.add_argument("--history-runs", type=int, default=3,
                    help="--policy auto: earlier live runs of the same tasks (epochs 1..N) in the store, the "
                         "ensemble auto simulates (default 3, as bench/robustness.py's three members)")  # fmt: skip
    ap.add_argument("--policy", choices=("defaults", "auto"), default="defaults",
                    help="defaults: the defaults against the best baseline; auto: a live history run of the same "
                         "tasks, then the batch with scheduling.policy auto against every baseline predicted within "
                         f"{LIVE_BASELINES:g}x of the best (targets: auto <= {TARGET:g}x the best baseline live, every "
                         f"live run within {WITHIN * 100:g} %% of its prediction)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.policy == "auto" and args.no_history:
        ap.error("--policy auto chooses from the history run of the same tasks, which gives the priors: drop --no-history")
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
    if args.policy == "auto":
        print(f"policy auto live within {TARGET:g}x of the best baseline live and every live run within {WITHIN:.0%} of "
              f"virtual time: {sum(matches)} of {len(matches)} families")  # fmt: skip
    else:
        print(f"live ordering of defaults vs best baseline matches virtual time: {sum(matches)} of {len(matches)} families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
