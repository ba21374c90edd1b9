"""Latency the inference gateway adds to a request, against calling the worker directly, in one run.

A simulated worker (`agentbatch serve-sim`, 100x faster than real time, so the engine's own time is
small) and `agentbatch gateway` (its store a temporary SQLite file) run as their own processes, as
they would be deployed. The same request goes to the worker and through the gateway, alternately, one
at a time; the added latency is the paired difference (gateway - direct) of each pair, reported as
p50/p99, for plain and streamed requests. A second phase sends from many concurrent clients and
compares throughput.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-cpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 180.0, any_status: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            status = httpx.get(url, timeout=2).status_code
            if status == 200 or any_status:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


@contextlib.contextmanager
def process(args: list[str], health: str, log: Path, any_status: bool = False) -> Iterator[subprocess.Popen]:
    """A child process (agentbatch CLI or an MCP server), stopped with SIGTERM at the end."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            wait_healthy(health, proc, any_status=any_status)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def sim_worker(tmp: Path, name: str, time_scale: float, profile: str = "tiny-cpu") -> Iterator[str]:
    port = free_port()
    args = ["-m", "agentbatch.flows.cli", "serve-sim", "--profile", profile, "--port", str(port),
            "--time-scale", str(time_scale), "--workers-name", name, "--served-model-name", MODEL]
    with process(args, f"http://127.0.0.1:{port}/health", tmp / f"{name}.log"):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def gateway(tmp: Path, workers: dict[str, str], scheduling: dict, mcp: list[str] = ()) -> Iterator[str]:
    """`agentbatch gateway` in front of `workers` ({name: base URL}); yields its base URL."""
    port = free_port()
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump({"name": "bench-gateway", "scheduling": scheduling, "engine": {
        "kind": "openai", "params": {"endpoints": [
            {"name": n, "base_url": u, "model": MODEL} for n, u in workers.items()]}}}))
    args = ["-m", "agentbatch.flows.cli", "gateway", "--config", str(config), "--port", str(port),
            "--db", f"sqlite:///{tmp / 'gateway.sqlite'}", "--no-prefect", "--no-progress"]
    for spec in mcp:
        args += ["--mcp", spec]
    with process(args, f"http://127.0.0.1:{port}/health", tmp / "gateway.log"):
        yield f"http://127.0.0.1:{port}"


def body(i: int, stream: bool) -> dict:
    return {"model": MODEL, "max_tokens": 8, "user": f"bench-{i % 50}", "stream": stream,
            "messages": [{"role": "user", "content": f"request {i % 50}: say something short"}]}


def one(client: httpx.Client, url: str, payload: dict) -> float:
    start = time.perf_counter()
    if payload["stream"]:
        with client.stream("POST", url, json=payload) as r:
            for _ in r.iter_bytes():
                pass
            assert r.status_code == 200, r.status_code
    else:
        r = client.post(url, json=payload)
        assert r.status_code == 200, r.text
    return time.perf_counter() - start


def paired(direct: str, through: str, n: int, stream: bool) -> tuple[np.ndarray, np.ndarray]:
    """n requests each way, alternating (direct first on even i, gateway first on odd i)."""
    d, g = [], []
    with httpx.Client(timeout=60) as client:
        for i in range(10):  # warm both paths (connections, prefix cache)
            one(client, direct + "/chat/completions", body(i, stream))
            one(client, through + "/v1/chat/completions", body(i, stream))
        for i in range(n):
            first, second = (direct + "/chat/completions", d), (through + "/v1/chat/completions", g)
            for url, out in ((first, second) if i % 2 == 0 else (second, first)):
                out.append(one(client, url, body(i, stream)))
    return np.array(d), np.array(g)


async def throughput(url: str, n: int, concurrency: int) -> float:
    """Requests per second from `concurrency` clients sending n requests in all."""
    counter = iter(range(n))

    async def client_loop(client: httpx.AsyncClient) -> None:
        for i in counter:
            r = await client.post(url, json=body(i, False))
            assert r.status_code == 200, r.text

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return n / (time.perf_counter() - start)


def ms(x: float) -> str:
    return f"{1000 * x:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="paired requests per mode (default 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients in the throughput phase")
    parser.add_argument("--time-scale", type=float, default=0.01, help="the simulated worker's time scale")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="agentbatch-gw-bench-") as tmpdir:
        tmp = Path(tmpdir)
        with sim_worker(tmp, "w0", args.time_scale) as worker, gateway(
                tmp, {"w0": worker}, {"max_active_samples": 256, "per_worker_inflight": 256}) as gw:
            rows = []
            for stream in (False, True):
                d, g = paired(worker, gw, args.requests, stream)
                rows.append(("streamed" if stream else "plain", d, g))
            n_tp = max(args.concurrency * 20, args.requests)
            tp_direct = asyncio.run(throughput(worker + "/chat/completions", n_tp, args.concurrency))
            tp_gateway = asyncio.run(throughput(gw + "/v1/chat/completions", n_tp, args.concurrency))
    print(f"gateway overhead: {args.requests} paired requests per mode, 1 simulated worker (tiny-cpu, time scale "
          f"{args.time_scale}), gateway and worker in their own processes, SQLite store")
    print(f"machine: {os.cpu_count()} cores, load average before {load_before[0]:.2f} / after "
          f"{os.getloadavg()[0]:.2f} (1 min)")
    print(f"{'mode':9} | {'direct p50':>10} {'p99':>7} | {'gateway p50':>11} {'p99':>7} | "
          f"{'added p50':>9} {'p99':>7} ms | ratio p50")
    for name, d, g in rows:
        added = g - d
        print(f"{name:9} | {ms(np.median(d)):>10} {ms(np.percentile(d, 99))} | {ms(np.median(g)):>11} "
              f"{ms(np.percentile(g, 99))} | {ms(np.median(added)):>9} {ms(np.percentile(added, 99))}    | "
              f"{np.median(g) / np.median(d):.2f}x")
    print(f"throughput, {args.concurrency} concurrent clients, {n_tp} requests: direct {tp_direct:.1f} req/s, "
          f"gateway {tp_gateway:.1f} req/s (ratio {tp_gateway / tp_direct:.2f})")


if __name__ == "__main__":
    main()
