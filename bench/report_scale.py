"""How long the dashboards take on a big recorded batch.

Writes a synthetic batch (N samples, chains of 6-40 alternating steps, 4 workers)
into a temporary SQLite store, then times: loading the batch into DataFrames (the baseline: one
read of its rows), the summary (load + every figure), and the full report (HTML + PNGs). Prints
each time and its ratio to the load.

    .venv/bin/python bench/report_scale.py [--samples 2000] [--db URL]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import insert

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.report import write_report
from agentbatch.dashboards.summary import summary_from_analysis
from agentbatch.db.models import Batch, Sample, Step
from agentbatch.db.store import Store


def build(store: Store, n: int, seed: int = 0) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    config: dict = {}  # no capacities: the analytics fall back to what the steps show
    with store.session() as s, s.begin():
        b = Batch(name=f"synthetic-{n}", config=config, status="completed", created_at=0.0, started_at=0.0)
        s.add(b)
        s.flush()
        bid = b.id
    samples, steps = [], []
    admit = np.sort(rng.uniform(0, n / 20, n))
    for i in range(n):
        t = float(admit[i])
        chain = int(rng.integers(3, 21)) * 2
        rows = []
        for k in range(chain):
            inf = k % 2 == 0
            enq = t + float(rng.exponential(0.05))
            start = enq + float(rng.exponential(0.2))
            dur = float(rng.gamma(2.0, 0.4 if inf else 0.6))
            fin = start + dur
            rows.append(dict(batch_id=bid, index=k, kind="inference" if inf else "environment", status="completed",
                             attempt=1, enqueued_at=enq, started_at=start, finished_at=fin,
                             worker=f"w{i % 4}" if inf else f"slot-{i % 16}",
                             prompt_tokens=500 + 200 * k if inf else None,
                             cached_prompt_tokens=(400 + 150 * k) if inf else None,
                             recomputed_tokens=int(rng.integers(0, 50)) if inf else None,
                             output_tokens=80 if inf else None, prefill_s=0.1 * dur if inf else None,
                             decode_s=0.8 * dur if inf else None, engine_queue_s=0.1 * dur if inf else None))
            t = fin
        samples.append(dict(batch_id=bid, index=i, task_id=f"task-{i}", task={}, status="completed",
                            steps_done=chain, score=float(rng.integers(0, 2)), admitted_at=float(admit[i]),
                            finished_at=t + 0.01))
        steps.append(rows)
    with store.engine.begin() as conn:
        ids = conn.execute(insert(Sample).returning(Sample.id, sort_by_parameter_order=True), samples).scalars().all()
        flat = [dict(r, sample_id=sid) for sid, rows in zip(ids, steps, strict=True) for r in rows]
        conn.execute(insert(Step), flat)
    return bid, len(flat)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--db", default=None, help="store URL (default: a temporary SQLite file)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db or f"sqlite:///{Path(tmp) / 'bench.sqlite'}")
        (bid, n_steps), t_build = timed(lambda: build(store, args.samples))
        print(f"batch {bid}: {args.samples} samples, {n_steps} step rows (written in {t_build:.1f} s)")
        _, t_load = timed(lambda: load_batch(store, bid))
        summary, t_sum = timed(lambda: summary_from_analysis(BatchAnalysis(load_batch(store, bid))))
        _, t_rep = timed(lambda: write_report(store, [bid], Path(tmp) / "report"))
        size = (Path(tmp) / "report" / "index.html").stat().st_size
        print(f"load (baseline)   {t_load:7.2f} s   1.00x")
        print(f"summary           {t_sum:7.2f} s   {t_sum / t_load:5.2f}x load")
        print(f"report html+png   {t_rep:7.2f} s   {t_rep / t_load:5.2f}x load   ({size / 1e6:.1f} MB page)")
        print(f"per 1000 step rows: summary {1000 * t_sum / n_steps * 1000:.1f} ms, report {1000 * t_rep / n_steps * 1000:.1f} ms")
        print(f"(synthetic batch: makespan {summary.makespan_s:.1f} s, {summary.samples_completed} samples)")
        store.close()


if __name__ == "__main__":
    main()
