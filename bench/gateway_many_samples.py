"""10,000 samples at once through `agentbatch gateway`: its memory, its CPU while they idle, `status`.

The gateway (one process, `--no-prefect`, a SQLite store or `--db`) fronts the fast fake
OpenAI-compatible worker of `bench/cluster_rate.py` with every sample admitted at once
(`max_active_samples` = N). The driver opens N samples (`x-agentbatch-sample` header), each sending
`--steps` chat requests (a 1 k-token system prompt, its conversation growing by one assistant turn
and one observation a step) over a pool of `--connections` connections, so every sample is open
from its first request until its explicit `POST /v1/samples/ID/finish`. Between the last request and
the finish, all N samples are open and idle for twice `--idle-s` seconds. The first window still
holds the commits of the last records (counted in the CPU per request); in the second the gateway's
CPU shows whether anything wakes per sample (a timer, a poll), beside its CPU while idle before the
first sample. While the requests run, `agentbatch status` is run as users run it (a new process)
every few seconds.

Printed: the gateway's peak resident memory (psutil, sampled every 0.2 s) beside its memory
before the first sample, its CPU per request, its CPU per second while the N samples idle, the
`status` answers, and a last line
`N samples through the gateway at once: peak RSS X GB (+Y GB for the samples); CPU M ms/request;
idle with N open C ms CPU/s; status Z s (CPU S s)`.

    .venv/bin/python bench/gateway_many_samples.py [--samples 10000] [--steps 2] [--connections 512]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quiet_prefect  # noqa: E402, F401 - Prefect settings before Prefect is imported

SYSTEM_TOKENS = 1000


class MemoryProbe:
    """The peak resident memory of a process and its children, sampled in a thread."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        import psutil

        self.proc, self.every_s = psutil.Process(pid), every_s
        self.peak = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def start_gateway(stack: ExitStack, tmp: Path, worker: str, samples: int, db: str) -> tuple[str, Any]:
    import yaml
    from gateway_overhead import free_port, process

    port = free_port()
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump({"name": "gateway-many-samples", "scheduling": {
        "max_active_samples": samples, "per_worker_inflight": 256}, "engine": {
        "kind": "openai", "params": {"endpoints": [{"name": "w0", "base_url": worker, "model": "fake"}]}}}))
    args = ["-m", "agentbatch.flows.cli", "gateway", "--config", str(config), "--port", str(port), "--db", db,
            "--no-prefect", "--no-progress", "--idle-timeout", "3600"]
    log = tmp / "gateway.log"
    try:
        proc = stack.enter_context(process(args, f"http://127.0.0.1:{port}/health", log))
    except RuntimeError:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise
    return f"http://127.0.0.1:{port}", proc


async def drive(url: str, args: argparse.Namespace, opened: asyncio.Event, finish: asyncio.Event) -> int:
    """Every sample's requests; once all have sent them, wait for `finish`, then finish them all."""
    import aiohttp

    from agentbatch.traces.conversation import filler

    system = filler(SYSTEM_TOKENS, "system/many-samples")
    left = [args.samples]

    async def sample(http: aiohttp.ClientSession, c: int) -> None:
        key = f"s{c}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": f"task {c}"}]
        for i in range(args.steps):
            async with http.post(url + "/v1/chat/completions", headers={"x-agentbatch-sample": key}, json={
                    "model": "fake", "messages": messages, "max_tokens": 16}) as r:
                assert r.status == 200, await r.text()
                answer = (await r.json())["choices"][0]["message"]
            messages = [*messages, answer, {"role": "tool", "tool_call_id": "call_0", "content": f"observation {i}"}]
        left[0] -= 1
        if not left[0]:
            opened.set()
        await finish.wait()
        async with http.post(url + f"/v1/samples/{key}/finish", json={"score": 1.0}) as r:
            assert r.status == 200, await r.text()

    connector = aiohttp.TCPConnector(limit=args.connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        await asyncio.gather(*(sample(http, c) for c in range(args.samples)))
    return args.samples * args.steps


def status_call(db: str, batch_id: int) -> tuple[float, float]:
    """Wall and CPU seconds of one `agentbatch status` process."""
    before, wall = os.times(), time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "status", str(batch_id), "--db", db],
                         capture_output=True, text=True, timeout=300)
    after = os.times()
    if out.returncode != 0:
        raise RuntimeError(f"status exited {out.returncode}: {out.stderr[-2000:]}")
    return time.perf_counter() - wall, (after.children_user - before.children_user) + (
        after.children_system - before.children_system)


def status_loop(db: str, every_s: float, stop: threading.Event, calls: list[tuple[float, float]]) -> None:
    while not stop.wait(every_s):
        calls.append(status_call(db, 1))


async def phases(url: str, args: argparse.Namespace, proc: Any, db: str
                 ) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """The requests (with `status` polled beside them), then the samples left open and idle."""
    from cluster_rate import gateway_cpu_s

    opened, finish = asyncio.Event(), asyncio.Event()
    empty0 = gateway_cpu_s(proc)
    await asyncio.sleep(args.idle_s)
    empty_cpu = gateway_cpu_s(proc) - empty0
    calls: list[tuple[float, float]] = []
    stop = threading.Event()
    poller = threading.Thread(target=status_loop, args=(db, args.status_every_s, stop, calls), daemon=True)
    cpu0, wall0 = gateway_cpu_s(proc), time.perf_counter()
    poller.start()
    driver = asyncio.create_task(drive(url, args, opened, finish))
    await opened.wait()
    stop.set()
    requests_cpu, requests_wall = gateway_cpu_s(proc) - cpu0, time.perf_counter() - wall0
    await asyncio.sleep(1.0)  # the last records committed
    windows = []  # the first idle window may still hold the last commits and closing connections
    for n in range(2):
        print(f"  idle window {n + 1} of {args.idle_s:g} s", flush=True)
        idle0 = gateway_cpu_s(proc)
        await asyncio.sleep(args.idle_s)
        windows.append(gateway_cpu_s(proc) - idle0)
    idle_cpu = windows[-1]
    finish.set()
    await driver
    await asyncio.to_thread(poller.join)
    return {"requests_cpu": requests_cpu, "requests_wall": requests_wall, "idle_cpu": idle_cpu,
            "empty_cpu": empty_cpu,
            "first_idle_cpu": windows[0]}, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000, help="samples, all admitted at once")
    parser.add_argument("--steps", type=int, default=2, help="chat requests per sample")
    parser.add_argument("--connections", type=int, default=512, help="the driver's connections to the gateway")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds all samples stay open and idle")
    parser.add_argument("--status-every-s", type=float, default=5.0, help="seconds between `status` calls")
    parser.add_argument("--db", default=None, help="store URL (default: a SQLite file in a temporary folder)")
    args = parser.parse_args()
    from cluster_rate import fake_worker

    print(f"load before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        db = args.db or f"sqlite:///{tmp / 'store.sqlite'}"
        worker = fake_worker(stack, tmp, "fake-0")
        url, proc = start_gateway(stack, tmp, worker, args.samples, db)
        probe = MemoryProbe(proc.pid)
        base_rss = probe.rss()
        out, calls = asyncio.run(phases(url, args, proc, db))
        peak = probe.stop()
        idle_calls = [status_call(db, 1) for _ in range(2)]
    requests = args.samples * args.steps
    per_request = (out["requests_cpu"] + out["first_idle_cpu"]) / requests  # with the commits that trail them
    print(f"  requests: {requests} in {out['requests_wall']:.1f} s wall, gateway CPU {out['requests_cpu']:.1f} s "
          f"(+{out['first_idle_cpu']:.1f} s committing after the last: {1000 * per_request:.2f} ms/request)")
    print(f"  memory: {base_rss / 1e9:.2f} GB before the first sample, peak {peak / 1e9:.2f} GB")
    print(f"  gateway idle for {args.idle_s:g} s: CPU {out['empty_cpu']:.3f} s before the first sample; with "
          f"{args.samples} samples open {out['first_idle_cpu']:.3f} s after the last request, {out['idle_cpu']:.3f} s "
          f"in the {args.idle_s:g} s after that")
    if calls:
        print(f"  `agentbatch status` while the requests ran: {len(calls)} calls, wall median "
              f"{statistics.median(c[0] for c in calls):.2f} s max {max(c[0] for c in calls):.2f} s, "
              f"CPU median {statistics.median(c[1] for c in calls):.2f} s")
    print(f"  `agentbatch status` once finished: wall {' '.join(f'{c[0]:.2f}' for c in idle_calls)} s")
    print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    shown = calls or idle_calls
    print(f"{args.samples} samples through the gateway at once: peak RSS {peak / 1e9:.2f} GB "
          f"(+{(peak - base_rss) / 1e9:.2f} GB for the samples); CPU {1000 * per_request:.2f} ms/request; idle with {args.samples} open {1000 * out['idle_cpu'] / args.idle_s:.0f} ms CPU/s "
          f"(none open {1000 * out['empty_cpu'] / args.idle_s:.0f}); "
          f"status {statistics.median(c[0] for c in shown):.2f} s (CPU {statistics.median(c[1] for c in shown):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
