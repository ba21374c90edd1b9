"""Robustness matrix: the policy chosen by simulation (`scheduling.policy: auto`) and the defaults
against the three strong baselines and the best candidate in hindsight, in every regime cell.

Cells: families x environment slots {S, 2S, 4S, 8S} (S = the family's slots, docs/traces.md) x engine
workers {1, 2, 4} x engine profiles {llama3-8b-h100, ling-flash-2.0-h200} x seeds, all in virtual time.
Per cell the batch is a trace of epoch 1 of the family's tasks. The choice (sim/portfolio.py
`decide`) sees only what a run could know before it starts: with history, the same tasks' earlier
run (epoch 0: its chain lengths and contexts are the priors) plus --ensemble - 1 reruns drawn from the
family's generator (epochs 2..: the workload's declared distribution of the same tasks), the priors
of epoch 0 in each; without history (--no-history), --ensemble batches drawn from the family's
generator with other seeds (other tasks), no priors. It simulates every candidate of the portfolio
(scheduling/portfolio.py: the baselines among them) on every member and picks by the minimax rule.
Then every candidate runs on the batch itself: the baselines' best (coupled at its best limit of
{S/4, S/2, S}; decoupled FIFO, all admitted; the paper's coupled at S), the oracle (the best
candidate in hindsight), the chosen one and the defaults (scheduling/defaults.py). A run that can no
longer be the best of its kind is cut (its makespan is known to be larger).

Each cell prints the makespans and ratios: chosen / best baseline, chosen / oracle, defaults / best
baseline, chosen / LB and / tight LB (scheduling/lower_bound.py; the tight one adds the window
bounds), and the time spent deciding as a share of the chosen makespan (virtual seconds stand for
the live run's: a prediction). The last line is
`cells worse than best baseline by >2%: K of N; geomean vs best baseline X; vs oracle Z; vs LB Y; vs tight LB W`
(all of the chosen policy); the line before it says why the worse cells lose (`CellResult.cause`): the
fallback baseline was not the batch's best, or a non-baseline ran and lost, and in how many the batch
lies outside every ensemble member (no rule on that ensemble could have known).

`--replan` re-plans while the batch runs (sim/replan.py): the chosen candidate runs on the batch with
checkpoints every --replan-every of its predicted makespan; at each, every candidate's remainder is
simulated from the batch's current state with the unrevealed futures drawn from the ensemble members,
and the batch switches when one is predicted no slower in any member and faster by --replan-margin on
average. The chosen column is then that re-planned run (each cell also prints the chosen candidate's
static ratio and the switches), and deciding includes the re-planning's time.

Scale: `--scale f` shrinks the batch (samples x f) and the hardware with it (slots x f, and each
engine's KV blocks, max_num_seqs and state slots x f; KV never below two 100k-token contexts), so a
cell keeps the samples-per-slot and samples-per-KV ratios of the full-size regime. The run stops after
--budget-s and summarises the cells that ran (a uniform sample: cells run in a fixed shuffled order;
it says how many). `--cells` reruns only the cells whose name (`family/profile/xM/wN`, M the slot
multiple, N the workers; `/sK` for seed K may follow) matches one of its comma-separated shell
patterns, e.g. `'widesearch_like/*/x4/w1'`.
Usage: .venv/bin/python bench/robustness.py [--scale 0.05] [--seeds 1] [--families ...] [--cells PATTERNS]
       [--no-history] [--ensemble 3] [--margin 0.01] [--replan [--replan-every 0.1] [--replan-margin 0.02]]
       [--jobs 2] [--budget-s 540]
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import random
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed
from dataclasses import dataclass, replace
from itertools import product

from agentbatch.planning import concurrency_for_profile
from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES, Candidate
from agentbatch.sim.portfolio import Member, candidate_config, decide
from agentbatch.sim.profiles import EngineProfile, get_profile
from agentbatch.sim.replan import Replanner, ReplanSettings
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.bounds import trace_tight_bound
from agentbatch.sim.virtual_time.simulation import SimulationCut, context_priors
from agentbatch.traces import FAMILIES, Trace, chain_priors, generate

PROFILES = ("llama3-8b-h100", "ling-flash-2.0-h200")
SLOT_MULTS = (1, 2, 4, 8)
WORKERS = (1, 2, 4)
DEFAULTS_NAME = "defaults"
BASELINE_NAMES = frozenset(c.name for c in BUILTIN_CANDIDATES if c.baseline)


@dataclass(frozen=True)
class Cell:
    family: str
    slot_mult: int
    workers: int
    profile: str
    scale: float
    seed: int
    history: bool = True  # priors: chain lengths and contexts of the same tasks in an earlier epoch
    ensemble: int = 3  # members the choice simulates
    margin: float = 0.01  # the rule's margin (scheduling/portfolio.py choose)
    replan: ReplanSettings | None = None  # re-plan while the batch runs (sim/replan.py)

    @property
    def name(self) -> str:
        return f"{self.family}/{self.profile}/x{self.slot_mult}/w{self.workers}"


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    samples: int
    env_slots: int
    n_ref: int
    chosen: str
    chosen_s: float
    default_s: float
    best_baseline: str
    baseline_s: float
    oracle: str
    oracle_s: float
    lb_s: float
    tight_lb_s: float
    lb_term: str
    decide_s: float
    decide_cpu_s: float
    simulations: int
    scores_same: bool
    wall_s: float
    fallback: str = ""  # the ensemble's best baseline (what the choice falls back on)
    fallback_s: float = math.nan  # its makespan on the batch itself
    score: float = math.nan  # the chosen one's worst predicted ratio to the best baseline over the members
    static_s: float = math.nan  # with --replan: the chosen candidate run to its end without re-planning
    switches: str = ""  # with --replan: "at_s:new" for each switch
    checkpoints: int = 0
    replan_cpu_s: float = 0.0  # with --replan: the re-planning's share of decide_cpu_s

    @property
    def ratio(self) -> float:
        return self.chosen_s / self.baseline_s

    def cause(self) -> str:
        """Why a cell is worse than its best baseline: the fallback baseline was not the batch's best
        ("fallback"), or a non-baseline ran and lost ("other"); "+uncovered" when the batch's ratio lies
        above every member's (the ensemble did not cover the batch: no rule on it could have known)."""
        kind = "fallback" if self.chosen == self.fallback else "other"
        return kind + ("+uncovered" if self.ratio > self.score + 0.02 else "")


def scaled_profile(name: str, f: float) -> EngineProfile:
    p = get_profile(name)
    # never below two of the longest contexts of any family (~100k tokens), so every request fits
    floor_blocks = -(-2 * 100_000 // p.block_size)
    changes = {"num_kv_blocks": max(floor_blocks, int(p.num_kv_blocks * f)), "max_num_seqs": max(4, int(p.max_num_seqs * f))}
    if p.state_slots is not None:
        changes["state_slots"] = max(4, int(p.state_slots * f))
        changes["state_checkpoints"] = max(2, int(p.state_checkpoints * f))
    return p.replace(**changes)


def members(cell: Cell, n: int, earlier: Trace | None) -> list[Member]:
    """What the choice sees (module docstring): never the batch's own trace (epoch 1)."""
    if earlier is not None:
        pri, ctx = chain_priors(earlier), context_priors(earlier)
        reruns = [generate(cell.family, n, seed=cell.seed, epoch=e) for e in range(2, cell.ensemble + 1)]
        return [Member(t, pri, ctx) for t in [earlier, *reruns]]
    return [Member(generate(cell.family, n, seed=10_000 + 100 * cell.seed + k, epoch=0)) for k in range(cell.ensemble)]


def run_cell(cell: Cell) -> CellResult:
    t0 = time.perf_counter()
    cap = FAMILIES[cell.family].capacities
    n = max(8, int(round(cap["samples"] * cell.scale)))
    slots = max(1, int(round(cap["env_slots"] * cell.scale))) * cell.slot_mult
    profile = scaled_profile(cell.profile, cell.scale)
    trace = generate(cell.family, n, seed=cell.seed, epoch=1)
    earlier = generate(cell.family, n, seed=cell.seed, epoch=0) if cell.history else None
    n_ref = concurrency_for_profile(trace, profile, workers=cell.workers).n_ref
    base = VirtualConfig(workers=cell.workers, profile=profile, env_slots=slots)
    ensemble = members(cell, n, earlier)
    d = decide(ensemble, base, n_ref=n_ref, margin=cell.margin)
    priors = chain_priors(earlier) if earlier is not None else None
    contexts = context_priors(earlier) if earlier is not None else None
    hindsight = _Hindsight(trace, base, n_ref, priors, contexts)
    runs = hindsight.all(d.candidates, full={d.choice.name, d.choice.fallback, DEFAULTS_NAME})
    bases = {c.name: runs[c.name] for c in d.candidates if c.baseline}
    best_base = min(bases, key=lambda k: bases[k])
    oracle = min(runs, key=lambda k: runs[k])
    tight = trace_tight_bound(trace, profile, cell.workers, slots)
    r = CellResult(cell, n, slots, n_ref, d.choice.name, runs[d.choice.name], runs[DEFAULTS_NAME], best_base,
                   bases[best_base], oracle, runs[oracle], tight.plain.value, tight.value, tight.plain.binding,
                   d.decide_s, d.decide_cpu_s, d.simulations, len(hindsight.scores) == 1, time.perf_counter() - t0,
                   d.choice.fallback, runs[d.choice.fallback], d.choice.score, static_s=runs[d.choice.name])  # fmt: skip
    if cell.replan is None:
        return r
    rp = Replanner(ensemble, d.candidates, d.chosen, n_ref, cell.replan)
    raw = hindsight.replanned(d.chosen, rp, statistics.median(x for x in d.predictions[d.choice.name] if math.isfinite(x)))
    return replace(r, chosen_s=raw, decide_s=r.decide_s + rp.wall_s, decide_cpu_s=r.decide_cpu_s + rp.cpu_s,
                   simulations=r.simulations + rp.simulations, scores_same=len(hindsight.scores) == 1,
                   switches=" ".join(f"{sw.at_s:.0f}s:{sw.new}" for sw in rp.switches), checkpoints=rp.checkpoints,
                   replan_cpu_s=rp.cpu_s, wall_s=time.perf_counter() - t0)  # fmt: skip


class _Hindsight:
    """Every candidate on the batch itself: the ones in `full` to their end, the baselines each cut
    at the best baseline so far, the others at the best run so far (their minima stay exact)."""

    def __init__(self, trace: Trace, base: VirtualConfig, n_ref: int, priors: dict[str, float] | None,
                 contexts: dict[str, float] | None) -> None:
        self.trace, self.base, self.n_ref, self.priors, self.contexts = trace, base, n_ref, priors, contexts
        self.scores: set[float] = set()

    def run(self, c: Candidate, stop: float | None) -> float:
        cfg = candidate_config(c, self.base, samples=len(self.trace.samples), n_ref=self.n_ref, priors=self.priors,
                               context_priors=self.contexts)  # fmt: skip
        try:
            raw = VirtualBatch(self.trace, cfg).run(stop_after_s=stop)
        except SimulationCut:
            return math.inf
        scores = [r[3] for r in raw.samples if r[3] is not None]
        self.scores.add(round(sum(scores) / len(scores), 12) if scores else 0.0)
        return raw.makespan_s

    def replanned(self, c: Candidate, replanner: Replanner, predicted_s: float) -> float:
        """The chosen candidate on the batch, re-planned at checkpoints (sim/replan.py)."""
        cfg = candidate_config(c, self.base, samples=len(self.trace.samples), n_ref=self.n_ref, priors=self.priors,
                               context_priors=self.contexts)  # fmt: skip
        batch = VirtualBatch(self.trace, cfg)
        replanner.attach(batch, predicted_s)
        raw = batch.run()
        scores = [r[3] for r in raw.samples if r[3] is not None]
        self.scores.add(round(sum(scores) / len(scores), 12) if scores else 0.0)
        return raw.makespan_s

    def all(self, pool: list[Candidate], full: set[str]) -> dict[str, float]:
        out = {c.name: self.run(c, None) for c in pool if c.name in full}
        for c in sorted((c for c in pool if c.name not in full), key=lambda c: not c.baseline):
            mine = [v for k, v in out.items() if any(b.name == k and b.baseline for b in pool)] if c.baseline else list(out.values())
            out[c.name] = self.run(c, min(mine, default=math.inf))
        return out


def _line(r: CellResult) -> str:
    c = r.cell
    flag = f"  WORSE ({r.cause()}; fallback {r.fallback} x{r.fallback_s / r.baseline_s:.3f})" if r.ratio > 1.02 else ""
    return (f"{c.family:16s} {c.profile:20s} S={r.env_slots:<3d} w={c.workers} s{c.seed}  n={r.samples:<4d} "
            f"N_ref={r.n_ref:<4d} chosen {r.chosen_s:8.1f} ({r.chosen})  best baseline {r.baseline_s:8.1f} "
            f"({r.best_baseline})  oracle {r.oracle_s:8.1f} ({r.oracle})  defaults {r.default_s:8.1f}  "
            f"x{r.ratio:.3f} best  x{r.chosen_s / r.oracle_s:.3f} oracle  defaults x{r.default_s / r.baseline_s:.3f} "
            f"best  x{r.chosen_s / r.lb_s:.3f} LB ({r.lb_s:.1f}s {r.lb_term})  x{r.chosen_s / r.tight_lb_s:.3f} "
            f"tight LB  deciding {r.decide_s:.2f}s = {100 * r.decide_s / r.chosen_s:.2f}% (cpu {r.decide_cpu_s:.2f}s; "
            f"{r.simulations} sims)"
            f"{_replan_note(r)}{'' if r.scores_same else '  SCORES DIFFER'}{flag}")  # fmt: skip


def _replan_note(r: CellResult) -> str:
    if r.cell.replan is None:
        return ""
    return (f"  replan: static x{r.static_s / r.baseline_s:.3f} best, {r.checkpoints} checkpoints (cpu "
            f"{r.replan_cpu_s:.2f}s = {100 * r.replan_cpu_s / r.chosen_s:.2f}%), switches [{r.switches}]")


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all)")
    ap.add_argument("--scale", type=float, default=0.05, help="batch and hardware scale (default 0.05)")
    ap.add_argument("--seeds", default="1", help="comma-separated trace seeds (default 1)")
    ap.add_argument("--cells", default="",
                    help="only cells whose name family/profile/xM/wN (or family/profile/xM/wN/sK, K the seed) "
                         "matches one of these comma-separated shell "
                         "patterns, e.g. 'widesearch_like/*/x4/w1' (default: all)")
    ap.add_argument("--no-history", action="store_true",
                    help="a first run of these tasks: no priors, the choice simulates batches drawn from the "
                         "family's generator (default: priors from an earlier epoch of the same tasks)")
    ap.add_argument("--ensemble", type=int, default=3, help="members the choice simulates (default 3)")
    ap.add_argument("--margin", type=float, default=0.01,
                    help="a non-baseline is chosen only if it beats the best baseline's score by this (default 0.01)")
    ap.add_argument("--replan", action="store_true",
                    help="re-plan while the batch runs (sim/replan.py): the chosen column is the chosen candidate "
                         "re-planned at checkpoints; deciding includes the re-planning")
    ap.add_argument("--replan-every", type=float, default=ReplanSettings.every,
                    help=f"checkpoint interval, share of the predicted makespan (default {ReplanSettings.every})")
    ap.add_argument("--replan-margin", type=float, default=ReplanSettings.margin,
                    help=f"gain over the running candidate every member must predict (default {ReplanSettings.margin})")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="stop starting cells after this many seconds and summarise those that ran (default 540)")
    return ap


def _cells(args: argparse.Namespace) -> list[Cell] | str:
    """The cells to run, in a fixed shuffled order (so a run cut short by --budget-s is a uniform
    sample of the matrix), or what is wrong with the arguments."""
    families = [f for f in args.families.split(",") if f]
    seeds = _seeds(args.seeds)
    problem = _problem(args, families, seeds)
    if problem:
        return problem
    replan = ReplanSettings(args.replan_every, args.replan_margin) if args.replan else None
    cells = [Cell(f, m, w, p, args.scale, seed, not args.no_history, args.ensemble, args.margin, replan)
             for seed, f, p, m, w in product(seeds, families, PROFILES, SLOT_MULTS, WORKERS)]
    cells = _matching(cells, [p for p in args.cells.split(",") if p])
    if not cells:
        return f"--cells {args.cells!r} matches no cell; names look like 'swe_like/llama3-8b-h100/x4/w1'"
    random.Random(0).shuffle(cells)
    return cells


def _seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        return []


def _problem(args: argparse.Namespace, families: list[str], seeds: list[int]) -> str | None:
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not 0 < args.scale <= 1:
        return f"--families must name {sorted(FAMILIES)} and --scale be in (0, 1]; got {unknown or args.scale}"
    if not seeds or args.ensemble < 1 or not 0 <= args.margin < 1:
        return (f"--seeds must be comma-separated whole numbers, --ensemble >= 1, --margin in [0, 1); got "
                f"{args.seeds!r}, {args.ensemble}, {args.margin}")
    return None


def _matching(cells: list[Cell], patterns: list[str]) -> list[Cell]:
    if not patterns:
        return cells
    return [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) or fnmatch.fnmatchcase(f"{c.name}/s{c.seed}", p)
                                    for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cells = _cells(args)
    if isinstance(cells, str):
        print(f"error: {cells}", file=sys.stderr)
        return 2
    print(f"# scale {args.scale}: samples, env slots and engine KV blocks / max_num_seqs / state slots x{args.scale}; "
          f"{len(cells)} cells; seeds {args.seeds}; {'history' if not args.no_history else 'no history'}; ensemble "
          f"{args.ensemble}; margin {args.margin}; {_replan_header(args)}budget {args.budget_s:.0f}s; load average {os.getloadavg()[0]:.1f}",
          flush=True)  # fmt: skip
    t0 = time.perf_counter()
    results: list[CellResult] = []
    # A SIGTERM (e.g. from `timeout`) runs the `finally` below, which stops the cells still running.
    signal.signal(signal.SIGTERM, _exit_on_term)
    pool = ProcessPoolExecutor(max_workers=max(1, args.jobs), initializer=signal.signal,
                               initargs=(signal.SIGTERM, signal.SIG_DFL))  # a worker dies on SIGTERM
    futures: list = []
    try:
        futures = [pool.submit(run_cell, c) for c in cells]
        for fut in as_completed(futures, timeout=args.budget_s):
            results.append(fut.result())
            print(_line(results[-1]), flush=True)
    except TimeoutError:
        print(f"# budget of {args.budget_s:.0f}s spent: {len(results)} of {len(cells)} cells ran", flush=True)
    finally:
        _stop(pool, all(f.done() for f in futures))
    return _summary(results, time.perf_counter() - t0)


def _replan_header(args: argparse.Namespace) -> str:
    return f"replan every {args.replan_every} margin {args.replan_margin}; " if args.replan else ""


def _exit_on_term(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: `timeout` signals the whole process group
    sys.exit(143)


def _stop(pool: ProcessPoolExecutor, all_done: bool) -> None:
    if all_done:  # nothing left to stop: a plain shutdown (terminating idle workers races their pipes)
        pool.shutdown(wait=True)
        return
    running = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in running:  # cells still running: stop them
        proc.terminate()


def _summary(results: list[CellResult], wall: float) -> int:
    if not results:
        print("# no cell ran")
        return 1
    ratios = [r.ratio for r in results]
    worse = sum(1 for x in ratios if x > 1.02)
    print(f"# {wall:.0f}s wall, load average {os.getloadavg()[0]:.1f}; scores identical in every cell: "
          f"{all(r.scores_same for r in results)}")  # fmt: skip
    _hardest_and_defaults(results)
    _deciding(results)
    _causes([r for r in results if r.ratio > 1.02])
    print(f"# {len(results)} cells ran")
    print(f"cells worse than best baseline by >2%: {worse} of {len(results)}; geomean vs best baseline "
          f"{_geomean(ratios):.3f}; vs oracle {_geomean([r.chosen_s / r.oracle_s for r in results]):.3f}; vs LB "
          f"{_geomean([r.chosen_s / r.lb_s for r in results]):.3f}; vs tight LB "
          f"{_geomean([r.chosen_s / r.tight_lb_s for r in results]):.3f}")  # fmt: skip
    return 0


def _hardest_and_defaults(results: list[CellResult]) -> None:
    hardest = sorted(results, key=lambda r: -r.ratio)[:5]
    print("# hardest cells (chosen / best baseline): " + "; ".join(
        f"{r.cell.name}/s{r.cell.seed} x{r.ratio:.3f} ({r.chosen} vs {r.best_baseline}, {r.cause()}; oracle {r.oracle} "
        f"x{r.oracle_s / r.baseline_s:.3f})" for r in hardest))  # fmt: skip
    print(f"# defaults: worse than best baseline by >2% in {sum(1 for r in results if r.default_s > 1.02 * r.baseline_s)} "
          f"of {len(results)}; geomean vs best baseline {_geomean([r.default_s / r.baseline_s for r in results]):.3f}; "
          f"oracle vs best baseline {_geomean([r.oracle_s / r.baseline_s for r in results]):.3f}")  # fmt: skip


def _causes(worse: list[CellResult]) -> None:
    causes = [r.cause() for r in worse]
    print(f"# why worse: {sum(c.startswith('fallback') for c in causes)} ran the fallback baseline, not the batch's "
          f"best; {sum(c.startswith('other') for c in causes)} ran a non-baseline that lost; "
          f"{sum(c.endswith('uncovered') for c in causes)} of the {len(worse)} lie outside every ensemble member "
          f"(the batch's ratio above the chosen one's worst predicted ratio + 2%)")  # fmt: skip


def _deciding(results: list[CellResult]) -> None:
    share = sorted(r.decide_s / r.chosen_s for r in results)
    cpu = sorted(r.decide_cpu_s / r.chosen_s for r in results)
    print(f"# deciding: median {100 * statistics.median(share):.2f}%, max {100 * share[-1]:.2f}% of the chosen "
          f"makespan in wall time (CPU time: median {100 * statistics.median(cpu):.2f}%, max {100 * cpu[-1]:.2f}%); "
          f"{sum(r.simulations for r in results)} simulations; chosen a baseline in "
          f"{sum(1 for r in results if r.chosen in BASELINE_NAMES)} of {len(results)} cells")  # fmt: skip
    if results[0].cell.replan is not None:
        rp = sorted(r.replan_cpu_s / r.chosen_s for r in results)
        moved = [r.chosen_s / r.static_s for r in results]
        print(f"# re-planning alone: CPU median {100 * statistics.median(rp):.2f}%, max {100 * rp[-1]:.2f}% of the "
              f"chosen makespan; {sum(1 for r in results if r.switches)} of {len(results)} cells switched; re-planned / "
              f"static chosen: geomean {_geomean(moved):.3f}, {sum(1 for x in moved if x < 0.995)} faster, "
              f"{sum(1 for x in moved if x > 1.005)} slower by >0.5%")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
