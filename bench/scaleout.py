"""Scale-out run: N `agentbatch join` worker processes drive one batch through one PostgreSQL store;
one is killed with SIGKILL mid-batch and the others take its samples over.

Prints the batch's wall time against the same batch run by one worker alone (same run, same
machine), how long after the kill the orphaned samples were running again, and checks that every
sample completed once and no (sample, step) completed twice.

Usage: python bench/scaleout.py --db postgresql+psycopg://USER:PASS@HOST/DB [--samples 48] [--workers 2]
(the database must exist; batches are added to it).

`--mode run-joins`: `agentbatch run CONFIG` and, once it drives the batch, two `agentbatch join`
processes beside it; prints how many samples each process drove (held the lease of) and checks the
batch finished with every process having driven samples. Needs a Prefect server (PREFECT_API_URL) or
starts one like bench/live_throughput.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from live_throughput import start_server  # noqa: E402

from agentbatch.db.store import Store  # noqa: E402
from agentbatch.flows.batch import create_batch  # noqa: E402
from agentbatch.flows.config import BatchConfig  # noqa: E402


def config(samples: int, scale: float = 1.0) -> BatchConfig:
    return BatchConfig.model_validate({
        "name": "scaleout-bench",
        "workload": {"kind": "bfcl", "params": {"limit": samples, "seed": 7}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": scale}}},
        "scheduling": {"max_active_samples": 8, "env_slots": 4, "per_worker_inflight": 4},
    })


def join(db: str, batch_id: int, chunk: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentbatch.flows.cli", "join", str(batch_id), "--chunk", str(chunk), "--poll", "0.5",
         "--no-progress"],
        env={**os.environ, "AGENTBATCH_DB_URL": db}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )


def owned_by(store: Store, batch_id: int, pid: int) -> set[int]:
    return {s.id for s in store.samples(batch_id, statuses=["pending", "running"])
            if s.lease_owner and s.lease_owner.split(":")[1] == str(pid)}


def check(store: Store, batch_id: int) -> int:
    seen: set[tuple[int, int]] = set()
    for st in store.steps(batch_id):
        if st.status == "completed":
            assert (st.sample_id, st.index) not in seen, f"step {(st.sample_id, st.index)} completed twice"
            seen.add((st.sample_id, st.index))
    samples = store.samples(batch_id)
    assert all(s.status == "completed" and s.score == 1.0 for s in samples), "a sample did not complete"
    return len(seen)


def run(db: str, samples: int, workers: int, chunk: int, kill: bool) -> dict[str, float]:
    store = Store(db)
    batch_id = create_batch(config(samples), store)
    started = time.perf_counter()
    procs = [join(db, batch_id, chunk) for _ in range(workers)]
    out: dict[str, float] = {}
    if kill:
        victim = procs[0]
        while not (owned_by(store, batch_id, victim.pid) and store.status_counts(batch_id).get("completed", 0)):
            time.sleep(0.1)
        orphaned = owned_by(store, batch_id, victim.pid)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        killed_at = time.perf_counter()
        out["killed_at_s"], out["orphaned"] = killed_at - started, len(orphaned)
        while owned_by(store, batch_id, victim.pid) == orphaned and any(p.poll() is None for p in procs[1:]):
            time.sleep(0.05)
        out["takeover_s"] = time.perf_counter() - killed_at
        procs = procs[1:]
    for p in procs:
        p.wait()
    out["wall_s"] = time.perf_counter() - started
    out["steps"] = check(store, batch_id)
    store.close()
    return out


def run_and_joins(db: str, samples: int, chunk: int) -> dict[str, float]:
    """`run` CONFIG, then two joins on its batch once it drives it; samples each process drove."""
    store = Store(db)
    before = max((b.id for b in store.list_batches()), default=0)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:  # JSON is YAML
        # steps 4x slower than the kill mode's: the joins start (seconds) while the run still has work
        json.dump(config(samples, scale=4.0).model_dump(mode="json", exclude_none=True), f)
    started = time.perf_counter()
    runner = subprocess.Popen([sys.executable, "-m", "agentbatch.flows.cli", "run", f.name, "--no-progress"],
                              env={**os.environ, "AGENTBATCH_DB_URL": db}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    while not (new := [b.id for b in store.list_batches() if b.id > before]) or not any(
            s.lease_owner for s in store.samples(new[0])):
        assert runner.poll() is None, "run ended before it drove the batch"
        time.sleep(0.1)
    batch_id = new[0]
    procs = {"run": runner, "join 1": join(db, batch_id, chunk), "join 2": join(db, batch_id, chunk)}
    drove: dict[int, set[int]] = {}
    while any(p.poll() is None for p in procs.values()):
        for sample in store.samples(batch_id):
            if sample.lease_owner:
                drove.setdefault(int(sample.lease_owner.split(":")[1]), set()).add(sample.id)
        time.sleep(0.1)
    out = {name: float(len(drove.get(p.pid, set()))) for name, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), {n: p.returncode for n, p in procs.items()}
    assert all(out.values()), f"a process drove no sample: {out}"
    out["wall_s"] = time.perf_counter() - started
    out["steps"] = check(store, batch_id)
    os.unlink(f.name)
    store.close()
    return out


def main_run_joins(args: argparse.Namespace) -> int:
    server = start_server()
    try:
        load = os.getloadavg()[0]
        out = run_and_joins(args.db, args.samples, args.chunk)
    finally:
        server.stop()
    print(f"{args.samples} BFCL samples (scripted engine, token timing), PostgreSQL, timing scale 4, join chunk {args.chunk}, run "
          f"window 16; {os.cpu_count()} CPUs, load average {load:.2f} at the start\n")
    print("| process | samples driven |\n|---|---|")
    for name in ("run", "join 1", "join 2"):
        print(f"| {name} | {out[name]:.0f} |")
    print(f"\nbatch finished in {out['wall_s']:.1f} s, {out['steps']:.0f} steps; every sample completed once, no "
          "(sample, step) completed twice, every process exit 0")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="PostgreSQL store URL")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--mode", choices=["kill", "run-joins"], default="kill",
                        help="kill: N joins, alone and with one SIGKILLed (default); run-joins: 1 run + 2 joins")
    args = parser.parse_args()
    if args.mode == "run-joins":
        return main_run_joins(args)
    server = start_server()
    try:
        load = os.getloadavg()[0]
        alone = run(args.db, args.samples, 1, args.chunk, kill=False)
        crew = run(args.db, args.samples, args.workers, args.chunk, kill=False)
        killed = run(args.db, args.samples, args.workers, args.chunk, kill=True)
    finally:
        server.stop()
    print(f"{args.samples} BFCL samples (scripted engine, token timing), PostgreSQL, chunk {args.chunk}; "
          f"{os.cpu_count()} CPUs, load average {load:.2f} at the start\n")
    print("| run | wall s | x one worker | steps |")
    print("|---|---|---|---|")
    print(f"| 1 worker | {alone['wall_s']:.1f} | 1.00 | {alone['steps']:.0f} |")
    print(f"| {args.workers} workers | {crew['wall_s']:.1f} | {crew['wall_s'] / alone['wall_s']:.2f} | {crew['steps']:.0f} |")
    print(f"| {args.workers} workers, one SIGKILLed at {killed['killed_at_s']:.1f} s | {killed['wall_s']:.1f} | "
          f"{killed['wall_s'] / alone['wall_s']:.2f} | {killed['steps']:.0f} |")
    print(f"\n{killed['orphaned']:.0f} sample(s) orphaned by the kill, running again {killed['takeover_s']:.1f} s later; "
          "every sample completed once, no (sample, step) completed twice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
