"""Robustness matrix: the default policy against the three strong baselines in every regime cell.

Cells: families x environment slots {S, 2S, 4S, 8S} (S = the family's slots, docs/traces.md) x engine
workers {1, 2, 4} x engine profiles {llama3-8b-h100, ling-flash-2.0-h200}, all in virtual time. Per
cell: the default policy (scheduling/defaults.py: decoupled admission starting at the resource
model's N_ref with adaptive admission control, CAAS, trajectory-aware routing, chain-progress
priority, longest-prior-first admission with priors from an earlier epoch of the same tasks) and the
baselines of agentbatch/dashboards/baselines.py: (a) coupled at its best limit of the sweep
{S/4, S/2, S}, (b) decoupled FIFO with all samples admitted and session affinity, (c) the paper's
coupled baseline at the slots. Each cell prints the makespans, the default's ratio to the best
baseline and to the lower bound LB; the last line is
`cells worse than best baseline: K of N; geomean vs best baseline X; geomean vs LB Y`.

Scale: `--scale f` shrinks the batch (samples x f) and the hardware with it (slots x f, and each
engine's KV blocks, max_num_seqs and state slots x f; KV never below two 100k-token contexts), so a cell keeps the samples-per-slot and
samples-per-KV ratios of the full-size regime. The run stops after --budget-s and summarises the
cells that ran (a uniform sample: cells run in a fixed shuffled order; it says how many).
`--no-history` runs the defaults without priors (a first run of the tasks); `--admission-order` runs
them with another admission order (scheduling/admission_order.py; with history the defaults get the
chain lengths and the contexts the same tasks reached in an earlier epoch). `--cells` reruns only
the cells whose name (`family/profile/xM/wN`, M the slot multiple, N the workers) matches one of
its comma-separated shell patterns, e.g. `'widesearch_like/*/x4/w1'`.
Usage: .venv/bin/python bench/robustness.py [--scale 0.05] [--families ...] [--cells PATTERNS] [--no-history]
       [--admission-order ORDER] [--jobs 2] [--budget-s 540]
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import random
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed
from dataclasses import dataclass
from itertools import product

from agentbatch.dashboards.baselines import baselines, compare
from agentbatch.planning import concurrency_for_profile
from agentbatch.scheduling.admission_order import ADMISSION_ORDERS
from agentbatch.scheduling.defaults import DEFAULTS
from agentbatch.sim.profiles import EngineProfile, get_profile
from agentbatch.sim.virtual_time import VirtualConfig, simulate
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import FAMILIES, chain_priors, generate

PROFILES = ("llama3-8b-h100", "ling-flash-2.0-h200")
SLOT_MULTS = (1, 2, 4, 8)
WORKERS = (1, 2, 4)


@dataclass(frozen=True)
class Cell:
    family: str
    slot_mult: int
    workers: int
    profile: str
    scale: float
    seed: int
    history: bool = True  # the defaults get priors (chain lengths of the same tasks in an earlier epoch)
    admission_order: str = DEFAULTS.admission_order  # the defaults' admission order (--admission-order)

    @property
    def name(self) -> str:
        return f"{self.family}/{self.profile}/x{self.slot_mult}/w{self.workers}"


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    samples: int
    env_slots: int
    n_ref: int
    default_s: float
    baseline_s: dict[str, float]
    lb_s: float
    lb_term: str
    scores_same: bool
    wall_s: float


def scaled_profile(name: str, f: float) -> EngineProfile:
    p = get_profile(name)
    # never below two of the longest contexts of any family (~100k tokens), so every request fits
    floor_blocks = -(-2 * 100_000 // p.block_size)
    changes = {"num_kv_blocks": max(floor_blocks, int(p.num_kv_blocks * f)), "max_num_seqs": max(4, int(p.max_num_seqs * f))}
    if p.state_slots is not None:
        changes["state_slots"] = max(4, int(p.state_slots * f))
        changes["state_checkpoints"] = max(2, int(p.state_checkpoints * f))
    return p.replace(**changes)


def run_cell(cell: Cell) -> CellResult:
    t0 = time.perf_counter()
    cap = FAMILIES[cell.family].capacities
    n = max(8, int(round(cap["samples"] * cell.scale)))
    slots = max(1, int(round(cap["env_slots"] * cell.scale))) * cell.slot_mult
    profile = scaled_profile(cell.profile, cell.scale)
    trace = generate(cell.family, n, seed=cell.seed, epoch=1)
    # the same tasks, run before (--no-history: a first run, no priors)
    earlier = generate(cell.family, n, seed=cell.seed, epoch=0) if cell.history else None
    priors = chain_priors(earlier) if earlier is not None else None
    contexts = context_priors(earlier) if earlier is not None else None  # the kv_balanced order's
    n_ref = concurrency_for_profile(trace, profile, workers=cell.workers).n_ref
    default = VirtualConfig(workers=cell.workers, profile=profile, env_slots=slots, max_active=n_ref,
                            per_worker_inflight=None, priors=priors, context_priors=contexts,
                            admission_order=cell.admission_order)  # fmt: skip
    res = simulate(trace, default)
    scores = {round(res.summary.mean_score, 12)}
    best: dict[str, float] = {}
    for b in baselines(default, n):
        runs = [simulate(trace, c).summary for c in b.configs]
        scores |= {round(s.mean_score, 12) for s in runs}
        best[b.name] = min(s.makespan_s for s in runs)
    s = res.summary
    return CellResult(cell, n, slots, n_ref, s.makespan_s, best, s.lower_bound_s, s.lb_binding, len(scores) == 1,
                      time.perf_counter() - t0)  # fmt: skip


def _line(r: CellResult) -> str:
    c = r.cell
    cmp_ = compare(r.default_s, r.baseline_s)
    base = "  ".join(f"{v:8.1f}" for v in r.baseline_s.values())
    flag = "  WORSE" if cmp_.ratio > 1.0 else ""
    return (f"{c.family:16s} {c.profile:20s} S={r.env_slots:<3d} w={c.workers}  n={r.samples:<4d} N_ref={r.n_ref:<4d} "
            f"default {r.default_s:8.1f}  base {base}  x{cmp_.ratio:.3f} best ({cmp_.best_name})  "
            f"x{r.default_s / r.lb_s:.3f} LB ({r.lb_s:.1f}s {r.lb_term}){'' if r.scores_same else '  SCORES DIFFER'}{flag}")


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all)")
    ap.add_argument("--scale", type=float, default=0.05, help="batch and hardware scale (default 0.05)")
    ap.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    ap.add_argument("--cells", default="",
                    help="only cells whose name family/profile/xM/wN matches one of these comma-separated shell "
                         "patterns, e.g. 'widesearch_like/*/x4/w1' (default: all)")
    ap.add_argument("--no-history", action="store_true",
                    help="run the defaults without priors, as a first run of these tasks (default: priors from an "
                         "earlier epoch of the same tasks)")
    ap.add_argument("--admission-order", choices=ADMISSION_ORDERS, default=DEFAULTS.admission_order,
                    help="the defaults' admission order, to compare orders over the matrix (default "
                         f"{DEFAULTS.admission_order}; the baselines admit in trace order)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="stop starting cells after this many seconds and summarise those that ran (default 540)")
    return ap


def _cells(args: argparse.Namespace) -> list[Cell] | str:
    """The cells to run, in a fixed shuffled order (so a run cut short by --budget-s is a uniform
    sample of the matrix), or what is wrong with the arguments."""
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not 0 < args.scale <= 1:
        return f"--families must name {sorted(FAMILIES)} and --scale be in (0, 1]; got {unknown or args.scale}"
    cells = [Cell(f, m, w, p, args.scale, args.seed, not args.no_history, args.admission_order)
             for f, p, m, w in product(families, PROFILES, SLOT_MULTS, WORKERS)]
    cells = _matching(cells, [p for p in args.cells.split(",") if p])
    if not cells:
        return f"--cells {args.cells!r} matches no cell; names look like 'swe_like/llama3-8b-h100/x4/w1'"
    random.Random(0).shuffle(cells)
    return cells


def _matching(cells: list[Cell], patterns: list[str]) -> list[Cell]:
    if not patterns:
        return cells
    return [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cells = _cells(args)
    if isinstance(cells, str):
        print(f"error: {cells}", file=sys.stderr)
        return 2
    print(f"# scale {args.scale}: samples, env slots and engine KV blocks / max_num_seqs / state slots x{args.scale}; "
          f"{len(cells)} cells; admission order {args.admission_order}; budget {args.budget_s:.0f}s; load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    print("# baselines per cell (in order): (a) coupled, best limit of {S/4,S/2,S}; (b) decoupled FIFO, all admitted; "
          "(c) coupled at slots (paper)", flush=True)  # fmt: skip
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
    ratios = [compare(r.default_s, r.baseline_s).ratio for r in results]
    lbs = [r.default_s / r.lb_s for r in results]
    worse = sum(1 for x in ratios if x > 1.0)
    hardest = sorted(zip(ratios, results, strict=True), key=lambda e: -e[0])[:5]
    print(f"# {wall:.0f}s wall, load average {os.getloadavg()[0]:.1f}; scores identical in every cell: "
          f"{all(r.scores_same for r in results)}")  # fmt: skip
    print("# hardest cells (default / best baseline): " + "; ".join(
        f"{r.cell.family}/{r.cell.profile}/S={r.env_slots}/w={r.cell.workers} x{x:.3f}" for x, r in hardest))
    # No policy ends below LB, so X cannot go below the geomean of LB / best baseline, and a cell whose
    # best baseline is within 1/0.85 of LB cannot reach x0.85 at all.
    floor = [r.lb_s / min(r.baseline_s.values()) for r in results]
    print(f"# the best baseline vs LB: geomean {_geomean([1 / x for x in floor]):.3f}; lowest reachable geomean vs "
          f"best baseline (default = LB everywhere) {_geomean(floor):.3f}; cells where x0.85 is below LB: "
          f"{sum(1 for x in floor if x > 0.85)} of {len(results)}")  # fmt: skip
    print(f"# {len(results)} cells ran")
    print(f"cells worse than best baseline: {worse} of {len(results)}; geomean vs best baseline {_geomean(ratios):.3f}; "
          f"geomean vs LB {_geomean(lbs):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
