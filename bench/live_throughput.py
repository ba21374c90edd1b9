"""Live orchestration throughput: the same BFCL chains (scripted engine, zero latency) as
(a) raw: a plain asyncio loop that only calls the engine and the environment (no store, no Prefect),
(b) lean: the batch flow in lean mode (a Prefect task run per sample, every step in the store),
(c) visible: the default mode (chains: a task run per sample, every step in the store and listed in
    batched Prefect events),
(d) raw+rows: the raw loop writing the same step rows and sample progress to the same store, one
    transaction per step (what a plain asyncio loop needs so that a step counts only once committed),
and, with --steps-mode, (e) steps: a Prefect task run per step, for comparison.

Each at 200 and 2,000 samples (BFCL has 800 multi-turn tasks; larger batches repeat them); steps/s,
client CPU ms/step and the Prefect server's CPU ms/step, in one run on one machine. --rss-samples N
also runs a lean batch of N samples in a child process and prints its peak RSS.

A Prefect server is started for the run (its temporary in-process server loses records) unless
PREFECT_API_URL points at one. Usage:
    python bench/live_throughput.py [--samples 200,2000] [--rss-samples 10000] [--db URL] [--steps-mode]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

for key, value in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
                   "PREFECT_LOGGING_TO_API_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
                   "AGENTBATCH_PREFECT_SERVER": "ephemeral"}.items():
    os.environ.setdefault(key, value)

ADMITTED = 256  # samples at once in every mode


def batch_config(samples: int, mode: str) -> dict[str, Any]:
    return {
        "name": f"throughput-{mode}-{samples}",
        "workload": {"kind": "bfcl", "params": {"seed": 5}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0}}},
        "scheduling": {"max_active_samples": ADMITTED, "env_slots": 64, "per_worker_inflight": 128},
        "execution": {"mode": mode if mode in ("lean", "steps") else "chains"},
    }


def tasks_for(samples: int) -> list[tuple[Any, ...]]:
    """`samples` BFCL tasks: the 800 multi-turn tasks (seeded order), repeated as needed."""
    from agentbatch.flows.batch import workload_tasks
    from agentbatch.flows.config import BatchConfig

    base = workload_tasks(BatchConfig.model_validate(batch_config(1, "lean")))
    return [base[i % len(base)] for i in range(samples)]


# --- the Prefect server: started here unless configured; its CPU is read from /proc --------------------
@dataclass
class Server:
    url: str
    pgid: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    def cpu_s(self) -> float | None:
        if self.pgid is None:
            return None
        total, tick = 0.0, os.sysconf("SC_CLK_TCK")
        for pid in os.listdir("/proc"):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == self.pgid:  # process group
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=30)


def start_server() -> Server:
    import httpx

    if os.environ.get("PREFECT_API_URL"):
        return Server(os.environ["PREFECT_API_URL"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="prefect-home-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "PREFECT_HOME": home, "PREFECT_UI_ENABLED": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                os.environ["PREFECT_API_URL"] = url
                return Server(url, pgid=proc.pid, proc=proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the Prefect server did not start in 240 s")


# --- the three ways to run the chains ---------------------------------------------------------------------
@dataclass
class Row:
    mode: str
    samples: int
    steps: int
    wall_s: float
    cpu_s: float
    server_cpu_s: float | None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    def cells(self) -> str:
        server = "-" if self.server_cpu_s is None else f"{1000 * self.server_cpu_s / self.steps:.2f}"
        return (f"| {self.mode} | {self.samples} | {self.steps} | {self.wall_s:.2f} | {self.steps_per_s:.0f} | "
                f"{1000 * self.cpu_s / self.steps:.3f} | {server} |")


class RowSink:
    """raw+rows: each step's row and its sample's progress committed in one transaction, in line."""

    def __init__(self, db: str, samples: int) -> None:
        from agentbatch.db.models import Sample, Step
        from agentbatch.db.store import Store

        self.store = Store(db)
        self.batch_id = self.store.create_batch(f"raw-rows-{samples}", {}, tasks_for(samples))
        self.sample_ids = [s.id for s in self.store.samples(self.batch_id)]
        self.steps, self.samples = Step.__table__, Sample.__table__

    def write(self, i: int, index: int, kind: str, response: dict[str, Any], tokens: dict[str, Any]) -> None:
        from sqlalchemy import insert, update

        now = time.time()
        with self.store.engine.begin() as conn:
            conn.execute(insert(self.steps), {
                "batch_id": self.batch_id, "sample_id": self.sample_ids[i], "index": index, "kind": kind,
                "attempt": 1, "status": "completed", "enqueued_at": now, "started_at": now, "finished_at": now,
                "response": response, **tokens})
            conn.execute(update(self.samples).where(self.samples.c.id == self.sample_ids[i])
                         .values(steps_done=index + 1))

    def close(self) -> None:
        self.store.close()


async def raw_loop(samples: int, sink: RowSink | None = None) -> int:
    """Engine and environment only (the floor that any orchestration adds to); with a sink, plus
    the store writes a plain loop needs."""
    from agentbatch.engines.registry import make_engines
    from agentbatch.environments.registry import make_workload
    from agentbatch.protocols.engine import ChatRequest
    from agentbatch.protocols.environment import TaskSpec
    from agentbatch.scheduling.types import StepKind
    from agentbatch.tasks.agent import AgentState

    cfg = batch_config(samples, "raw")
    workload = make_workload("bfcl", cfg["workload"]["params"])
    engines = make_engines("scripted", cfg["engine"]["params"], workload)
    gate = asyncio.Semaphore(ADMITTED)
    steps = 0

    async def one(i: int, task_id: str, data: dict[str, Any]) -> None:
        nonlocal steps
        async with gate:
            task = TaskSpec(task_id=task_id, data=data)
            env = workload.create(task)
            state = AgentState.start(await env.reset(task))
            engine = engines[i % len(engines)]
            while not state.done and state.step_index < 80:
                if state.next_kind == StepKind.INFERENCE:
                    result = await engine.complete(ChatRequest(messages=state.messages, tools=state.tools,
                                                               sample_id=i, task_id=task_id,
                                                               step_index=state.step_index))
                    state.apply_inference(result.message)
                    if sink is not None:
                        sink.write(i, state.step_index - 1, "inference", AgentState.inference_record(result),
                                   {"prompt_tokens": result.prompt_tokens, "output_tokens": result.output_tokens})
                else:
                    assert state.last_assistant is not None
                    out = await env.step(state.last_assistant)
                    state.apply_environment(out.messages, out.done, out.info.get("tools"))
                    if sink is not None:
                        sink.write(i, state.step_index - 1, "environment", AgentState.environment_record(out),
                                   {"tool_calls": out.tool_calls})
                steps += 1
            assert (await env.score())["score"] == 1.0
            await env.close()

    async with asyncio.TaskGroup() as group:
        for i, (task_id, data, *_) in enumerate(tasks_for(samples)):
            group.create_task(one(i, task_id, data))
    for e in engines:
        await e.aclose()
    await workload.aclose()
    return steps


def run_flow_mode(db: str, samples: int, mode: str) -> int:
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import create_batch, run_flow
    from agentbatch.flows.config import BatchConfig

    store = Store(db)
    try:
        batch_id = create_batch(BatchConfig.model_validate(batch_config(samples, mode)), store, tasks_for(samples))
        run_flow(store, batch_id, show_progress=False)
        rows = store.samples(batch_id)
        assert all(s.status == "completed" and s.score == 1.0 for s in rows), "a sample did not complete"
        return sum(s.steps_done for s in rows)
    finally:
        store.close()


def measure(mode: str, samples: int, db: str, server: Server) -> Row:
    tasks_for(samples)  # list the tasks before the clock starts (same for every mode)
    server_before = server.cpu_s()
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "raw":
        steps = asyncio.run(raw_loop(samples))
    elif mode == "raw+rows":
        sink = RowSink(db, samples)
        try:
            steps = asyncio.run(raw_loop(samples, sink))
        finally:
            sink.close()
    else:
        steps = run_flow_mode(db, samples, mode)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server_after = server.cpu_s()
    server_cpu = None if mode.startswith("raw") or server_before is None or server_after is None else server_after - server_before
    return Row(mode, samples, steps, wall, cpu, server_cpu)


# --- peak RSS of a big lean batch, in a child process -----------------------------------------------------
def rss_child(samples: int, db: str) -> None:
    steps = run_flow_mode(db, samples, "lean")
    print(f"{steps} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")


def peak_rss(samples: int, db: str) -> tuple[int, int, float]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--rss-child", str(samples), "--db", db],
                         capture_output=True, text=True, check=True)
    steps, kib = out.stdout.strip().splitlines()[-1].split()
    return int(steps), int(kib), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="200,2000", help="batch sizes, comma-separated (default 200,2000)")
    parser.add_argument("--rss-samples", type=int, default=0, help="also: peak RSS of a lean batch this big (0: skip)")
    parser.add_argument("--db", default=None, help="store URL (default: a temp SQLite file)")
    parser.add_argument("--steps-mode", action="store_true", help="also run steps mode (a task run per step; slow)")
    parser.add_argument("--rss-child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    db = args.db or f"sqlite:///{tempfile.mkdtemp()}/throughput.sqlite"
    if args.rss_child:
        rss_child(args.rss_child, db)
        return 0
    sizes = [int(x) for x in args.samples.split(",")]
    server = start_server()
    try:
        load_before = os.getloadavg()
        measure("lean", 4, db, server)  # warm-up: imports, the flow's first run
        modes = ["raw", "raw+rows", "lean", "visible"] + (["steps"] if args.steps_mode else [])
        rows = [measure(mode, n, db, server) for n in sizes for mode in modes]
        load_after = os.getloadavg()
        rss = peak_rss(args.rss_samples, db) if args.rss_samples else None
    finally:
        server.stop()
    print(f"store {db.split('@')[-1]}; Prefect API {server.url}; {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (1 min)\n")
    print("| mode | samples | steps | wall s | steps/s | client CPU ms/step | server CPU ms/step |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row.cells())
    if rss is not None:
        steps, kib, wall = rss
        print(f"\npeak RSS, lean, {args.rss_samples} samples ({steps} steps, {wall:.0f} s): {kib / 1024:.0f} MiB")
    big = max(sizes)
    by = {r.mode: r for r in rows if r.samples == big}
    print(f"\nat {big} samples: lean {by['lean'].steps_per_s / by['raw'].steps_per_s:.2f}x raw, visible "
          f"{by['visible'].steps_per_s / by['raw'].steps_per_s:.2f}x raw; client CPU per step: lean "
          f"{by['lean'].cpu_s / by['raw+rows'].cpu_s:.2f}x raw+rows (a plain loop writing the same rows)")
    print(f"lean steps/s {by['lean'].steps_per_s:.0f} ({by['lean'].steps_per_s / by['raw'].steps_per_s:.2f} of raw); "
          f"visible steps/s {by['visible'].steps_per_s:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
