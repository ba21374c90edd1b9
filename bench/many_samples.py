"""10,000 samples admitted at once through `run`: the memory of the run and how fast `status` answers.

A recorded `mcp_like` batch of N samples (chains cut to a few steps to keep the run short) is run
in-process by `flows/batch.py:run_batch` with every sample admitted at once (`max_active_samples` = N)
against the replay engine's timing model (no server: the cost measured is agentbatch's own) and the
recorded environment at time scale 0. While it runs, `agentbatch status BATCH` is run as users run it
(a new process) every few seconds; its wall and CPU time are printed beside the time its queries
(`estimate_eta`) take in this process (the process start, Python and imports, are the rest). Once
the batch has finished, `status` is run a few more times on the idle store.

Printed: the run's wall and CPU time, its peak resident memory (ru_maxrss) beside the memory before
the batch started, the status answers, and a last line
`N samples at once: peak RSS X GB (+Y GB for the batch); status Z s (CPU C s), idle I s (CPU D s)`.

    .venv/bin/python bench/many_samples.py [--samples 10000] [--steps 4] [--mode lean] [--keep-db PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quiet_prefect  # noqa: E402, F401 - Prefect settings before Prefect is imported


def short_trace(samples: int, steps: int, path: Path) -> Path:
    """`samples` recorded mcp_like samples, each cut to at most `steps` steps (an even number: the
    chain ends on an environment step)."""
    from agentbatch.traces.generators import generate, get_family
    from agentbatch.traces.parquet import write_trace

    trace = generate(get_family("mcp_like"), samples, seed=5)
    for s in trace.samples:
        s.steps = s.steps[: max(2, steps - steps % 2)]
    return write_trace(trace, path)


def config(trace: Path, samples: int, mode: str) -> Any:
    from agentbatch.flows.config import BatchConfig

    return BatchConfig.model_validate({
        "name": "many-samples",
        "workload": {"kind": "recorded", "params": {"trace": str(trace), "time_scale": 0.0}},
        "engine": {"kind": "replay", "params": {"inner": "timing", "timing": {"kind": "token", "scale": 0.0},
                                                "workers": 4}},
        "scheduling": {"max_active_samples": samples, "env_slots": 256, "per_worker_inflight": 256},
        "execution": {"mode": mode},
    })


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024**3


def status_time(db: str, batch_id: int) -> tuple[float, float] | None:
    """Wall and CPU seconds of `agentbatch status BATCH` in a new process, as users run it; None when
    it failed. The CPU is read from this process's children (it starts no other while it runs)."""
    t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "status", str(batch_id), "--db", db],
                          capture_output=True, text=True, timeout=120)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return (wall, cpu) if done.returncode == 0 else None


class StatusProbe:
    """Runs `agentbatch status` in a new process every `every_s` while the batch runs."""

    def __init__(self, db: str, every_s: float) -> None:
        self.db, self.every_s = db, every_s
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.queries: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        from agentbatch.dashboards.eta import estimate_eta
        from agentbatch.db.store import Store

        store = Store(self.db)
        while not self._stop.wait(self.every_s):
            batches = store.list_batches()
            if not batches or batches[0].status != "running":
                continue
            t = time.perf_counter()
            estimate_eta(store, batches[0].id)  # the queries `status` runs
            self.queries.append(time.perf_counter() - t)
            if (took := status_time(self.db, batches[0].id)) is not None:
                self.walls.append(took[0])
                self.cpus.append(took[1])
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000, help="samples, all admitted at once")
    parser.add_argument("--steps", type=int, default=4, help="steps per sample (recorded chains cut to this)")
    parser.add_argument("--mode", default="lean", choices=["lean", "steps", "chains"], help="execution mode")
    parser.add_argument("--status-every-s", type=float, default=3.0, help="seconds between `status` calls")
    parser.add_argument("--idle-calls", type=int, default=3, help="`status` calls once the batch has finished")
    parser.add_argument("--keep-db", type=Path, default=None, metavar="PATH",
                        help="write the store to this SQLite file (kept) instead of a temporary one")
    args = parser.parse_args()

    from agentbatch.db.store import Store
    from agentbatch.flows.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="agentbatch-many-") as tmp:
        trace = short_trace(args.samples, args.steps, Path(tmp) / "trace.parquet")
        db = f"sqlite:///{args.keep_db or Path(tmp) / 'many.sqlite'}"
        store = Store(db)
        before = rss_gb()
        probe = StatusProbe(db, args.status_every_s)
        probe.start()
        wall, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        batch_id = run_batch(config(trace, args.samples, args.mode), store, show_progress=False)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - wall
        probe.stop()
        idle = [took for _ in range(args.idle_calls) if (took := status_time(db, batch_id)) is not None]
        counts = store.status_counts(batch_id)
        steps = sum(store.step_counts(batch_id).values())
        store.close()
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    peak = peak_rss_gb()
    print(f"many samples: {args.samples} samples all admitted at once, {steps} steps, mode {args.mode}; "
          f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print(f"  run: {wall:.1f} s wall, {cpu:.1f} s CPU ({1000 * cpu / max(steps, 1):.2f} ms/step); samples {counts}")
    print(f"  memory: {before:.2f} GB before the batch, peak {peak:.2f} GB")
    nan = [float("nan")]
    walls, cpus, queries = probe.walls or nan, probe.cpus or nan, probe.queries or nan
    idle_walls, idle_cpus = [w for w, _ in idle] or nan, [c for _, c in idle] or nan
    print(f"  `agentbatch status` while it ran: {len(probe.walls)} calls, wall median {statistics.median(walls):.2f} s "
          f"max {max(walls):.2f} s, CPU median {statistics.median(cpus):.2f} s; estimate_eta in this process "
          f"median {statistics.median(queries):.3f} s max {max(queries):.3f} s")
    print(f"  `agentbatch status` once it finished: {len(idle)} calls, wall median {statistics.median(idle_walls):.2f} s, "
          f"CPU median {statistics.median(idle_cpus):.2f} s")
    print(f"{args.samples} samples at once: peak RSS {peak:.2f} GB (+{peak - before:.2f} GB for the batch); "
          f"status {statistics.median(walls):.2f} s (CPU {statistics.median(cpus):.2f} s), "
          f"idle {statistics.median(idle_walls):.2f} s (CPU {statistics.median(idle_cpus):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
