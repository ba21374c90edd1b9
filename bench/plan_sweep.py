"""Does the resource model's reference concurrency land near the simulated best?

For each case (a synthetic workload family on a simulated engine profile) the resource model picks
the sample concurrency from the trace and the profile alone (`concurrency_for_profile`: KV capacity,
checkpoint pool, cost model; no simulation). Then the virtual-time simulator (one engine worker,
environment slots unconstrained, so the GPU side decides) runs the same trace at a sweep of
concurrencies around the pick, and the bench prints the makespan per concurrency, the best, and the
pick's ratio to the best. Also shown, measured in the same run: the strict pick min(N_mem, N_busy)
(no eviction allowed) and the family's default `max_active` as a baseline.

    .venv/bin/python bench/plan_sweep.py            # four cases, ~3 min on 2 cores
    .venv/bin/python bench/plan_sweep.py --quick    # smaller batches, ~1 min

Hybrid case: the trace is generated without a shared system prompt (system_tokens = 0); see the
note printed with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from agentbatch.planning import concurrency_for_profile
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.traces.generators import generate, get_family

CASES = [
    # family, profile, samples (full, quick), drop the shared prefix
    ("swe_like", "llama3-8b-h100", (200, 80), False),
    ("widesearch_like", "llama3-8b-h100", (150, 60), False),
    ("bfcl_like", "llama3-8b-h100", (600, 300), False),  # short contexts: the busy bound binds
    ("mcp_like", "ling-flash-2.0-h200", (200, 80), True),
]
FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)


def run_case(family: str, profile_name: str, samples: int, no_prefix: bool, seed: int) -> dict:
    spec = get_family(family)
    if no_prefix:
        spec = dataclasses.replace(spec, system_tokens=0)
    trace = generate(spec, samples=samples, seed=seed)
    profile = get_profile(profile_name)
    t0 = time.perf_counter()
    pick = concurrency_for_profile(trace, profile)
    n_ref, bounds = pick.n_ref, pick.bounds
    n_fit = concurrency_for_profile(trace, profile, allow_recompute=False).n_ref
    plan_s = time.perf_counter() - t0
    # the family's default admission limit, capped by the batch size
    baseline = min(int(spec.capacities.get("max_active", 64)), samples)
    grid = sorted({max(1, round(n_ref * k)) for k in FACTORS} | {n_fit, baseline} - {0})
    grid = [n for n in grid if n <= samples]
    rows = []
    for n in grid:
        t = time.perf_counter()
        # no driver cap on requests in flight and no request priority: the engine alone decides
        res = simulate(trace, VirtualConfig(workers=1, profile=profile, max_active=n, env_slots=10**6,
                                            per_worker_inflight=None, priority=PolicySpec("fcfs")))
        s = res.summary
        rows.append(
            {
                "n": n,
                "makespan": s.makespan_s,
                "hit": s.cache_hit_rate,
                "recomputed": s.recomputed_tokens,
                "preemptions": s.preemptions,
                "wall": time.perf_counter() - t,
            }
        )
        print(
            f"    N={n:>4}: makespan {s.makespan_s:9.1f} s  ({time.perf_counter() - t:.1f} s wall)",
            file=sys.stderr,
        )
    return {
        "family": family,
        "profile": profile_name,
        "samples": samples,
        "no_prefix": no_prefix,
        "n_ref": n_ref,
        "n_fit": n_fit,
        "baseline": baseline,
        "bounds": bounds,
        "plan_s": plan_s,
        "rows": rows,
    }


def report(case: dict) -> dict[str, float]:
    rows = case["rows"]
    best = min(rows, key=lambda r: r["makespan"])
    by_n = {r["n"]: r for r in rows}
    b = case["bounds"]
    print(
        f"\n== {case['family']} on {case['profile']}: {case['samples']} samples, 1 worker, env slots unconstrained"
        + (" (no shared system prompt)" if case["no_prefix"] else "")
    )
    print(
        f"   plan: N_ref={case['n_ref']} (N_mem={b['n_mem']}, N_busy={b['n_busy']}, B_busy={b['b_busy']}, "
        f"f={b['env_fraction']:.3f} at {b['decode_tokens_per_s']:.0f} tok/s/seq; "
        f"N_goodput={b.get('n_goodput', '-')}), computed in {1e3 * case['plan_s']:.1f} ms"
    )
    print(
        f"   {'N':>5}  {'makespan s':>10}  {'x best':>6}  {'hit rate':>8}  {'recomputed tok':>14}  {'preempt':>7}"
    )
    for r in rows:
        marks = []
        if r["n"] == case["n_ref"]:
            marks.append("<- pick N_ref")
        if r["n"] == case["n_fit"]:
            marks.append("<- strict pick min(N_mem, N_busy): no eviction")
        if r["n"] == case["baseline"]:
            marks.append("<- baseline max_active")
        if r is best:
            marks.append("* best")
        print(
            f"   {r['n']:>5}  {r['makespan']:>10.1f}  {r['makespan'] / best['makespan']:>6.3f}  {r['hit']:>8.3f}  "
            f"{r['recomputed']:>14,}  {r['preemptions']:>7}  {' '.join(marks)}"
        )
    pick = by_n[case["n_ref"]]["makespan"] / best["makespan"]
    fit = by_n[case["n_fit"]]["makespan"] / best["makespan"]
    base = by_n[case["baseline"]]["makespan"] / best["makespan"] if case["baseline"] in by_n else float("nan")
    print(
        f"   pick N_ref={case['n_ref']}: {pick:.3f} x best (best N={best['n']}); strict={case['n_fit']}: {fit:.3f} x best; "
        f"baseline max_active={case['baseline']}: {base:.3f} x best; pick / baseline = {pick / base:.3f}"
    )
    return {"pick": pick, "fit": fit, "baseline": base}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = []
    for family, profile, sizes, no_prefix in CASES:
        print(f"{family} on {profile} ...", file=sys.stderr)
        results.append(
            report(run_case(family, profile, sizes[1] if args.quick else sizes[0], no_prefix, args.seed))
        )
    print("\nSummary (makespan relative to the best concurrency of the sweep, all measured in this run):")
    for (family, profile, _, _), r in zip(CASES, results, strict=True):
        print(
            f"   {family:<16} {profile:<20} pick {r['pick']:.3f}  strict {r['fit']:.3f}  baseline {r['baseline']:.3f}"
        )
    print(
        "\nNote: the hybrid case drops the shared system prompt because the simulated engine (sim/model.py) loses "
        "all later prefix hits of a hybrid-model sample whose first prompt matched another sample's cached KV "
        "without a state checkpoint (reported to the main engineer)."
    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
