"""Does re-planning while the batch runs gain with one earlier run, or only with several?

In virtual time, on the configuration of bench/live_ordering.py (16 samples of a family, 4
environment slots, 2 engine workers of the family's profile, N_ref 12): per family and task seed,
the batch is epoch 0 and the earlier runs are epochs 1..M of the same tasks (M = --members; their
chain lengths are the priors, as a live `policy: auto` gets them from the store). The choice
(sim/portfolio.py `decide`) runs statically and re-planned every 10 % of its predicted makespan
(sim/replan.py, the rule live runs use), and both against the best baseline on the batch. The last
line: `re-planned / static: geomean G over N cells, F faster, S slower by >0.5%; re-planned vs best
baseline: geomean B, K worse by >2% (static: B0, K0)`. All figures are virtual time (predictions).

Usage: .venv/bin/python bench/replan_members.py [--members 1] [--seeds 1-6]
       [--families mcp_like,widesearch_like,swe_like]
"""

from __future__ import annotations

import argparse
import math
import statistics

from agentbatch.sim.portfolio import Member, candidate_config, decide
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.replan import Replanner, ReplanSettings
from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import FAMILIES, chain_priors, generate

SAMPLES, SLOTS, WORKERS, N_REF = 16, 4, 2, 12


def cell(family: str, seed: int, members: int) -> tuple[float, float, float, str]:
    """(static, re-planned, best baseline) makespans on the batch and the switches made."""
    batch = generate(family, SAMPLES, seed=seed, epoch=0)
    earlier = [generate(family, SAMPLES, seed=seed, epoch=e) for e in range(1, members + 1)]
    priors, contexts = chain_priors(earlier[0]), context_priors(*earlier)
    ensemble = [Member(t, priors, contexts) for t in earlier]
    base = VirtualConfig(workers=WORKERS, profile=get_profile(FAMILIES[family].capacities["profile"]),
                         env_slots=SLOTS, max_active=N_REF)  # fmt: skip
    d = decide(ensemble, base, n_ref=N_REF)

    def run(c: object, replanner: Replanner | None = None, predicted: float = 0.0) -> float:
        cfg = candidate_config(c, base, samples=SAMPLES, n_ref=N_REF, priors=priors, context_priors=contexts)  # type: ignore[arg-type]
        b = VirtualBatch(batch, cfg)
        if replanner is not None:
            replanner.attach(b, predicted)
        return b.run().makespan_s

    best = min(run(c) for c in d.candidates if c.baseline)
    predicted = statistics.median(x for x in d.predictions[d.choice.name] if math.isfinite(x))
    rp = Replanner(ensemble, d.candidates, d.chosen, N_REF, ReplanSettings())
    replanned = run(d.chosen, rp, predicted)
    switches = ", ".join(f"{s.at_s:.0f}s:{s.new}" for s in rp.switches) or "none"
    return run(d.chosen), replanned, best, f"chose {d.choice.name!r}; switches {switches}"


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1, help="earlier runs of the same tasks (default 1)")
    ap.add_argument("--seeds", default="1-6", help="task seeds, e.g. 1-6 (default)")
    ap.add_argument("--families", default="mcp_like,widesearch_like,swe_like")
    args = ap.parse_args()
    rows = []
    for family in args.families.split(","):
        for seed in _seeds(args.seeds):
            static, replanned, best, what = cell(family, seed, args.members)
            rows.append((static, replanned, best))
            print(f"{family:16s} s{seed}: static/best {static / best:.3f} re-planned/best {replanned / best:.3f} "
                  f"re-planned/static {replanned / static:.3f}  {what}", flush=True)  # fmt: skip

    def geo(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    gain = [r / s for s, r, _ in rows]
    print(f"# {args.members} earlier run(s) per batch; seeds {args.seeds}; families {args.families}")
    print(f"re-planned / static: geomean {geo(gain):.3f} over {len(rows)} cells, {sum(g < 0.995 for g in gain)} faster, "
          f"{sum(g > 1.005 for g in gain)} slower by >0.5%; re-planned vs best baseline: geomean "
          f"{geo([r / b for _, r, b in rows]):.3f}, {sum(r / b > 1.02 for _, r, b in rows)} worse by >2% (static: "
          f"{geo([s / b for s, _, b in rows]):.3f}, {sum(s / b > 1.02 for s, _, b in rows)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
