"""Speed of the virtual-time batch simulation: events/s and seconds per batch size.

A BFCL-like trace stretched to ~30 steps per sample (15 inference + 15 environment steps), replayed
on 8 simulated Llama-3-8B workers with 2,048 samples admitted and 256 environment slots,
trajectory-aware routing and CAAS. Prints wall and CPU seconds (the machine may be shared: CPU
seconds are the steadier figure), events per second, and the growth against the smallest batch.
Usage: .venv/bin/python bench/sim_speed.py [--sizes 1000,2500,5000,10000] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
import time

from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.traces import generate

CONFIG = VirtualConfig(workers=8, env_slots=256, max_active=2048, router=PolicySpec("trajectory_aware"),
                       env_queue=PolicySpec("caas"), priority=PolicySpec("chain_progress"),
                       per_worker_inflight=None)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,2500,5000,10000")
    ap.add_argument("--steps", type=float, default=30.0, help="target mean steps per sample")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    scale = args.steps / 8.9  # bfcl_like averages ~8.9 steps per sample unstretched
    base = None
    print(f"{'samples':>8} {'steps':>8} {'steps/sample':>12} {'events':>9} {'wall_s':>8} {'cpu_s':>8} "
          f"{'events/s':>9} {'cpu x smallest':>14} {'per-sample x':>12}  makespan_s  x LB")  # fmt: skip
    for n in sizes:
        trace = generate("bfcl_like", n, seed=args.seed, turns_scale=scale)
        c0, w0 = time.process_time(), time.perf_counter()
        r = simulate(trace, CONFIG)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        s = r.summary
        base = base or (n, cpu)
        growth = cpu / base[1]
        per_sample = growth / (n / base[0])
        print(f"{n:>8} {s.steps:>8} {s.steps / n:>12.1f} {s.events:>9} {wall:>8.2f} {cpu:>8.2f} "
              f"{s.events / cpu:>9.0f} {growth:>14.2f} {per_sample:>12.2f}  {s.makespan_s:10.1f}  {s.lb_ratio:.3f}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
