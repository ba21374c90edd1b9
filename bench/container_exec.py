"""Per-step overhead of running a command in a Docker sandbox, against the same command on the host.

Measured in one run on this machine: exec of `true` and of a small command (`ls /etc | wc -l`)
through the pool (exec_run with stdout/stderr demuxed, the `timeout` wrapper, the exec limit),
against `subprocess.run` of the same command on the host and against a bare SDK `exec_run` (the
engine's own cost, no pool); p50/p99 and the ratio to the host. Also the
create+start and remove time of one hardened sandbox, and throughput with several at once.

    .venv/bin/python bench/container_exec.py [--n 200] [--containers 10] [--parallel 4]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
import uuid

from agentbatch.environments.docker_pool import DockerPool


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def fmt(name: str, xs: list[float], base: list[float] | None = None) -> str:
    p50, p99 = pct(xs, 0.5) * 1e3, pct(xs, 0.99) * 1e3
    line = f"{name:<34} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms"
    if base:
        line += f"   x{pct(xs, 0.5) / pct(base, 0.5):7.1f} of host p50"
    return line


async def main(n: int, containers: int, parallel: int) -> None:
    pool = DockerPool(batch_label=f"bench-{uuid.uuid4().hex[:8]}", max_exec=parallel)
    try:
        sb = await pool.start("bench")
        commands = ["true", "ls /etc | wc -l"]
        for _ in range(5):  # warm up
            await pool.exec(sb, "true")
        print(f"container exec vs host subprocess, n={n} each")
        for cmd in commands:
            host, box = [], []
            for _ in range(n):
                t = time.perf_counter()
                subprocess.run(["bash", "-c", cmd], capture_output=True, check=False)
                host.append(time.perf_counter() - t)
                t = time.perf_counter()
                res = await pool.exec(sb, cmd)
                box.append(time.perf_counter() - t)
                assert res.ok
            raw = []  # the bare SDK call, no pool: what the engine itself costs
            for _ in range(min(n, 50)):
                t = time.perf_counter()
                sb.container.exec_run(["bash", "-c", cmd], demux=True)
                raw.append(time.perf_counter() - t)
            print(fmt(f"host subprocess `{cmd}`", host))
            print(fmt(f"bare SDK exec_run `{cmd}`", raw, host))
            print(fmt(f"sandbox exec `{cmd}`", box, host))
            print(f"{'':<34} overhead p50 {(pct(box, 0.5) - pct(host, 0.5)) * 1e3:.2f} ms per command")

        t = time.perf_counter()
        await asyncio.gather(*(pool.exec(sb, "true") for _ in range(n)))
        wall = time.perf_counter() - t
        print(f"{n} execs of `true`, {parallel} at once: {n / wall:.1f} execs/s "
              f"({wall / n * 1e3:.2f} ms each amortised)")
        await pool.remove(sb)

        create, remove = [], []
        for i in range(containers):
            t = time.perf_counter()
            s = await pool.start(f"c{i}")
            create.append(time.perf_counter() - t)
            t = time.perf_counter()
            await pool.remove(s)
            remove.append(time.perf_counter() - t)
        print(f"sandbox lifecycle, n={containers}")
        print(fmt("create+start (hardened, volume)", create))
        print(fmt("remove (force, with volume)", remove))
    finally:
        await pool.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--containers", type=int, default=10)
    ap.add_argument("--parallel", type=int, default=4)
    a = ap.parse_args()
    asyncio.run(main(a.n, a.containers, a.parallel))
