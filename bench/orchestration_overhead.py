"""Orchestration overhead per step: the same BFCL chains in plain asyncio, through the Prefect flow
(one task run per step), in chains mode (the default: one task run per sample chain, steps as batched
Prefect events) and in lean mode (no task runs: the flow run and the store only), in one run.

The engine is the scripted one with no waiting, so the time is agentbatch + Prefect + the store +
the real bfcl backends and checker; the plain-asyncio run is the baseline that has all of it but
Prefect. Usage: python bench/orchestration_overhead.py [--samples 40] [--db URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quiet_prefect  # noqa: E402, F401 - Prefect settings before Prefect is imported

from agentbatch.db.store import Store  # noqa: E402
from agentbatch.flows.batch import create_batch, execute_batch, run_flow  # noqa: E402
from agentbatch.flows.config import BatchConfig  # noqa: E402


def config(samples: int, mode: str) -> BatchConfig:
    return BatchConfig.model_validate({
        "name": f"overhead-{mode}",
        "workload": {"kind": "bfcl", "params": {"limit": samples, "seed": 5}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0}}},
        "scheduling": {"max_active_samples": 32, "env_slots": 8, "per_worker_inflight": 16},
        "execution": {"mode": mode},
    })


def measure(store: Store, samples: int, mode: str) -> tuple[float, float, int]:
    batch_id = create_batch(config(samples, "steps" if mode == "plain" else mode), store)
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "plain":
        asyncio.run(execute_batch(store, batch_id, use_prefect=False, show_progress=False))
    else:
        run_flow(store, batch_id, show_progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = sum(1 for s in store.steps(batch_id) if s.status == "completed")
    assert all(s.score == 1.0 for s in store.samples(batch_id)), "a sample did not score"
    return wall, cpu, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--db", default=None, help="store URL (default: a temp SQLite file)")
    args = parser.parse_args()
    db = args.db or f"sqlite:///{tempfile.mkdtemp()}/overhead.sqlite"
    store = Store(db)
    print(f"store {db}; Prefect API {os.environ.get('PREFECT_API_URL', 'temporary server')}", file=sys.stderr)
    measure(store, 2, "steps")  # warm-up: starts Prefect's temporary server, imports, caches
    small = max(2, args.samples // 5)
    rows = {mode: (measure(store, small, mode), measure(store, args.samples, mode))
            for mode in ("plain", "steps", "chains", "lean")}
    (_, _, base_small), (base_wall, _, steps) = rows["plain"]
    base_marginal = (base_wall - rows["plain"][0][0]) / (steps - base_small)
    print(f"{args.samples} BFCL samples = {steps} steps per run ({small} samples = {base_small} steps for the "
          "marginal cost); same store, same machine, one run\n")
    print("| mode | wall s | client CPU s | wall ms/step | marginal ms/step | overhead ms/step vs plain "
          "(marginal) | fixed s per batch | x plain |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, ((w_small, _, n_small), (wall, cpu, n)) in rows.items():
        marginal = (wall - w_small) / (n - n_small)
        fixed = wall - marginal * n
        print(f"| {mode} | {wall:.2f} | {cpu:.2f} | {1000 * wall / n:.2f} | {1000 * marginal:.2f} | "
              f"{1000 * (marginal - base_marginal):+.2f} | {fixed:.2f} | {wall / base_wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
