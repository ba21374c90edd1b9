"""Ablation: each synthetic workload family replayed in virtual time against the strong baselines,
then one optimisation added per row.

Baselines (agentbatch/dashboards/baselines.py): (a) coupled at its best admission limit of the sweep
{S/4, S/2, S} with session-affinity routing; (b) decoupled FIFO, all samples admitted, session
affinity ("one semaphore around the tools"); (c) the paper's coupled baseline at the slots. Every
row's `vs_best` is its makespan over the best of the three, which is named.

Rows (cumulative, from (c)): baseline (coupled admission: a sample holds an environment slot from admission to
end, FIFO, round-robin) -> + resource-model concurrency (admission limit N_ref from the resource
model; still coupled, so it only bites where N_ref < environment slots) -> + trajectory-aware routing
-> + decoupled admission (N_ref samples admitted, environment actions queue for the slots) -> + CAAS
(environment queue and worker queues by chain progress, chain-progress engine priority) -> +
history-aware CAAS (priors: chain lengths of the same tasks in an earlier run, epoch 0; queues and
engine priority rank by the expected chain length, longest first, and samples are admitted longest
expected chain first) -> defaults (what `run` and `replay` use: decoupled, adaptive admission
starting at N_ref, CAAS environment queue, trajectory-aware routing, chain-progress priority,
longest-prior-first admission; scheduling/defaults.py).

Everything is measured in this one run; ratios are against the baseline row of the same family and
against the makespan lower bound of the same trace and hardware. Capacities: FamilySpec.capacities
(docs/traces.md). Usage: .venv/bin/python bench/ablation.py [--families swe_like,...] [--samples N]
[--seed S] [--markdown docs/ablation.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from agentbatch.dashboards.baselines import baselines, compare
from agentbatch.planning import concurrency_for_profile
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.traces import FAMILIES, chain_priors, generate

COLUMNS = ("family", "row", "makespan_s", "vs_best", "vs_LB", "LB_s", "LB_term", "hit_rate", "recomputed_tok",
           "p50_s", "p99_s", "score")  # fmt: skip


def rows_for(family: str, samples: int | None, seed: int) -> tuple[list[tuple[str, VirtualConfig]], object, dict]:
    spec = FAMILIES[family]
    cap = dict(spec.capacities)
    n = samples or cap["samples"]
    trace = generate(family, n, seed=seed, epoch=1)
    prior_trace = generate(family, n, seed=seed, epoch=0)  # the same tasks, run before
    priors = chain_priors(prior_trace)
    profile = get_profile(cap["profile"])
    pick = concurrency_for_profile(trace, profile, workers=cap["workers"])
    n_ref, bounds = pick.n_ref, pick.bounds
    # The baseline's policies are set explicitly (VirtualConfig's defaults are the coordinated ones);
    # no driver limit on requests in flight beyond the engine's own max_num_seqs in any row.
    base = VirtualConfig(workers=cap["workers"], profile=profile, env_slots=cap["env_slots"],
                         max_active=cap["env_slots"], coupled=True, per_worker_inflight=None,
                         router=PolicySpec("round_robin"), env_queue=PolicySpec("fifo"),
                         inference_queue=PolicySpec("fifo"), priority=PolicySpec("fcfs"),
                         admission_order="arrival", admission_control="static")  # fmt: skip
    rm = replace(base, max_active=n_ref)
    traj = replace(rm, router=PolicySpec("trajectory_aware"))
    dec = replace(traj, coupled=False)
    caas = replace(dec, env_queue=PolicySpec("caas"), inference_queue=PolicySpec("caas"),
                   priority=PolicySpec("chain_progress"))  # fmt: skip
    hist = replace(caas, env_queue=PolicySpec("caas_history"), inference_queue=PolicySpec("caas_history"),
                   priority=PolicySpec("chain_progress", {"use_prior": True}), priors=priors,
                   admission_order="longest_prior_first")  # fmt: skip
    rows = [
        ("baseline (coupled, FIFO, RR)", base),
        ("+ resource-model concurrency", rm),
        ("+ trajectory-aware routing", traj),
        ("+ decoupled admission", dec),
        ("+ CAAS", caas),
        ("+ history-aware CAAS", hist),
        ("defaults (adaptive admission)", VirtualConfig(workers=cap["workers"], profile=profile, env_slots=cap["env_slots"],
                                                        max_active=n_ref, per_worker_inflight=None, priors=priors)),
    ]
    info = {"samples": n, "n_ref": n_ref, "env_slots": cap["env_slots"], "workers": cap["workers"],
            "profile": profile.name, "env_fraction": round(bounds.get("env_fraction", 0.0), 3)}  # fmt: skip
    return rows, trace, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--samples", type=int, default=None, help="samples per family (default: the family's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown here")
    args = ap.parse_args(argv)
    out: list[dict] = []
    notes: list[str] = []
    t_all = time.perf_counter()
    for family in args.families.split(","):
        notes.append(_family(family, args, out))
    print(f"# total {time.perf_counter() - t_all:.1f}s; load average {os.getloadavg()[0]:.1f}")
    table = _markdown(out)
    print(table)
    scores = {}
    for row in out:
        scores.setdefault(row["family"], set()).add(round(row["score"], 12))
    same = all(len(v) == 1 for v in scores.values())
    print(f"scores identical across rows in every family: {same}")
    for f, best_name in zip(scores, notes, strict=True):
        final = next(r for r in out if r["family"] == f and r["row"].startswith("defaults"))
        print(f"{f}: defaults x{final['vs_best']:.3f} of the best baseline ({best_name}; "
              f"{(1 - final['vs_best']) * 100:.1f}% lower); x{final['vs_LB']:.3f} LB")
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0 if same else 1


def _family(family: str, args: argparse.Namespace, out: list[dict]) -> str:
    """Run the baselines and the rows of one family into `out`; returns the best baseline, named."""
    rows, trace, info = rows_for(family, args.samples, args.seed)
    print(f"# {family}: {info}", flush=True)
    base_ms: dict[str, float] = {}
    for b in baselines(rows[0][1], info["samples"]):
        runs = [(simulate(trace, c).summary, c) for c in b.configs]
        best_s, best_cfg = min(runs, key=lambda e: e[0].makespan_s)
        base_ms[b.name] = best_s.makespan_s
        label = f"{b.name} (limit {best_cfg.max_active})" if len(runs) > 1 else b.name
        out.append(_row(family, "baseline: " + label, best_s, 1.0))
    best = compare(1.0, base_ms)
    for row in out[-len(base_ms):]:
        row["vs_best"] = row["makespan_s"] / best.best_s
        _print(row)
    for label, cfg in rows[1:]:
        r = simulate(trace, cfg)
        out.append(_row(family, label, r.summary, r.summary.makespan_s / best.best_s))
        _print(out[-1])
    return f"best baseline {best.best_name} {best.best_s:.1f}s"


def _row(family: str, label: str, s: object, vs_best: float) -> dict:
    return {
        "family": family, "row": label, "makespan_s": s.makespan_s, "vs_best": vs_best, "vs_LB": s.lb_ratio,
        "LB_s": s.lower_bound_s, "LB_term": s.lb_binding, "hit_rate": s.cache_hit_rate,
        "recomputed_tok": s.recomputed_tokens, "p50_s": s.p50_latency_s, "p99_s": s.p99_latency_s,
        "score": s.mean_score,
    }  # fmt: skip


def _print(row: dict) -> None:
    print(
        f"{row['family']:16s} {row['row']:46s} makespan {row['makespan_s']:9.1f}s  x{row['vs_best']:.3f} best  "
        f"x{row['vs_LB']:.3f} LB ({row['LB_s']:.1f}s {row['LB_term']})  hit {row['hit_rate']:.3f}  "
        f"recomp {row['recomputed_tok']:>11,d}  p50 {row['p50_s']:8.1f}s  p99 {row['p99_s']:8.1f}s  "
        f"score {row['score']:.4f}",
        flush=True,
    )


def _markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    lines = [head]
    for r in rows:
        cells = []
        for c in COLUMNS:
            v = r[c]
            if c in ("vs_best", "vs_LB", "hit_rate"):
                cells.append(f"{v:.3f}")
            elif c == "score":
                cells.append(f"{v:.4f}")
            elif c == "recomputed_tok":
                cells.append(f"{v:,d}")
            elif isinstance(v, float):
                cells.append(f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
