"""Ablation: each synthetic workload family replayed in virtual time, one optimisation added per row.

Rows (cumulative): baseline (coupled admission: a sample holds an environment slot from admission to
end, FIFO, round-robin) -> + resource-model concurrency (admission limit N_ref from the resource
model; still coupled, so it only bites where N_ref < environment slots) -> + trajectory-aware routing
-> + decoupled admission (N_ref samples admitted, environment actions queue for the slots) -> + CAAS
(environment queue and worker queues by chain progress, chain-progress engine priority) -> +
history-aware CAAS (priors: chain lengths of the same tasks in an earlier run, epoch 0; queues and
engine priority rank by the expected chain length, longest first, and samples are admitted longest
expected chain first).

Everything is measured in this one run; ratios are against the baseline row of the same family and
against the makespan lower bound of the same trace and hardware. Capacities: FamilySpec.capacities
(docs/traces.md). Usage: .venv/bin/python bench/ablation.py [--families swe_like,...] [--samples N]
[--seed S] [--markdown docs/ablation.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from agentbatch.planning import concurrency_for_profile
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.traces import FAMILIES, chain_priors, generate

COLUMNS = ("family", "row", "makespan_s", "vs_base", "vs_LB", "LB_s", "LB_term", "hit_rate", "recomputed_tok",
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
                         admission_order="arrival")  # fmt: skip
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
        rows, trace, info = rows_for(family, args.samples, args.seed)
        notes.append(f"{family}: {info}")
        print(f"# {family}: {info}", flush=True)
        base_ms = None
        for label, cfg in rows:
            r = simulate(trace, cfg)
            s = r.summary
            base_ms = base_ms or s.makespan_s
            row = {
                "family": family, "row": label, "makespan_s": s.makespan_s, "vs_base": s.makespan_s / base_ms,
                "vs_LB": s.lb_ratio, "LB_s": s.lower_bound_s, "LB_term": s.lb_binding, "hit_rate": s.cache_hit_rate,
                "recomputed_tok": s.recomputed_tokens, "p50_s": s.p50_latency_s, "p99_s": s.p99_latency_s,
                "score": s.mean_score,
            }  # fmt: skip
            out.append(row)
            print(
                f"{family:16s} {label:30s} makespan {s.makespan_s:9.1f}s  x{row['vs_base']:.3f} base  "
                f"x{s.lb_ratio:.3f} LB ({s.lower_bound_s:.1f}s {s.lb_binding})  hit {s.cache_hit_rate:.3f}  "
                f"recomp {s.recomputed_tokens:>11,d}  p50 {s.p50_latency_s:8.1f}s  p99 {s.p99_latency_s:8.1f}s  "
                f"score {s.mean_score:.4f}  [{s.sim_wall_s:.1f}s sim]",
                flush=True,
            )
    print(f"# total {time.perf_counter() - t_all:.1f}s")
    table = _markdown(out)
    print(table)
    scores = {}
    for row in out:
        scores.setdefault(row["family"], set()).add(round(row["score"], 12))
    same = all(len(v) == 1 for v in scores.values())
    print(f"scores identical across rows in every family: {same}")
    best = {f: min(r["vs_base"] for r in out if r["family"] == f) for f in scores}
    final = {r["family"]: r for r in out if r["row"] == "+ history-aware CAAS"}
    for f in scores:
        print(f"{f}: best x{best[f]:.3f} of baseline ({(1 - best[f]) * 100:.1f}% lower); final row x{final[f]['vs_LB']:.3f} LB")
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0 if same else 1


def _markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    lines = [head]
    for r in rows:
        cells = []
        for c in COLUMNS:
            v = r[c]
            if c in ("vs_base", "vs_LB", "hit_rate"):
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
