"""Time to first step: seconds from typing `agentbatch run` to the first step starting, per way of
reaching Prefect, on the embedded default (SQLite store, scripted engine timed by the simulated one,
real bfcl backends), each as a fresh process, in one run.

Modes:
- plain:       the same command path without Prefect (imports, batch creation, plain asyncio): the
               baseline the ratios are against;
- reused:      `agentbatch run` with the local Prefect server already up (the default after the first run);
- first-run:   `agentbatch run` with no server up: it starts the local server and waits for it;
- ephemeral:   AGENTBATCH_PREFECT_SERVER=ephemeral (Prefect's temporary in-process server);
- configured:  PREFECT_API_URL pointing at a running server (same path as reused, for comparison).

Each figure is split into: process start -> batch created (imports, config, workload, store),
-> batch running (Prefect server and flow run), -> first step started, and the exit. A private
AGENTBATCH_HOME and PREFECT_HOME keep the user's own server and Prefect database out of it.

Usage: python bench/first_step.py [--samples 2] [--repeat 1] [--modes plain,reused,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("plain", "first-run", "reused", "configured", "ephemeral")

_PLAIN = """
import asyncio, sys
from agentbatch.flows.config import load_config
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, execute_batch
store = Store(sys.argv[2])
bid = create_batch(load_config(sys.argv[1]), store)
asyncio.run(execute_batch(store, bid, use_prefect=False, show_progress="off"))
"""


@dataclass
class Timing:
    mode: str
    created_s: float
    running_s: float
    first_step_s: float
    exit_s: float


def config_file(tmp: Path, samples: int) -> Path:
    path = tmp / "first_step.yaml"
    path.write_text(json.dumps({
        "name": "first-step",
        "workload": {"kind": "bfcl", "params": {"categories": ["multi_turn_base"], "limit": samples, "seed": 7}},
        "engine": {"kind": "scripted", "params": {"workers": 1, "timing": {
            "kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 1.0}}},
    }))
    return path


def env_for(mode: str, tmp: Path, api_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AGENTBATCH_"))}
    env.update(AGENTBATCH_HOME=str(tmp / "home"), PREFECT_HOME=str(tmp / "prefect-home"))
    if mode == "ephemeral":
        env["AGENTBATCH_PREFECT_SERVER"] = "ephemeral"
    if mode == "configured" and api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def run_once(mode: str, tmp: Path, cfg: Path, n: int, api_url: str | None) -> Timing:
    db = tmp / f"{mode}-{n}.sqlite"
    url = f"sqlite:///{db}"
    if mode == "plain":
        cmd = [sys.executable, "-c", _PLAIN, str(cfg), url]
    else:
        cmd = [sys.executable, "-m", "agentbatch.flows.cli", "run", str(cfg), "--db", url, "--quiet"]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env_for(mode, tmp, api_url), cwd=tmp, capture_output=True, text=True,
                          timeout=900)
    t_exit = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with sqlite3.connect(db) as conn:
        created, started = conn.execute("select created_at, started_at from batches").fetchone()
        (first,) = conn.execute("select min(started_at) from steps").fetchone()
    return Timing(mode, created - t0, started - t0, first - t0, t_exit - t0)


def local_server_url(tmp: Path) -> str | None:
    try:
        return json.loads((tmp / "home" / "prefect-server.json").read_text())["url"]
    except (OSError, ValueError, KeyError):
        return None


def stop_local_server(tmp: Path) -> None:
    subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "server", "stop"],
                   env=env_for("reused", tmp, None), capture_output=True, timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2, help="samples per batch")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode (first-run: once)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {bad}; expected some of {', '.join(MODES)}")
    load_before = os.getloadavg()
    results: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="agentbatch-first-step-") as d:
        tmp = Path(d)
        cfg = config_file(tmp, args.samples)
        # Warm the page cache (the first process to import Prefect and pandas would pay it alone).
        subprocess.run([sys.executable, "-c", "import agentbatch.flows.batch, agentbatch.dashboards.summary"],
                       check=True, timeout=600)
        try:
            for mode in [m for m in MODES if m in modes]:  # first-run before reused: it starts the server
                for n in range(1 if mode == "first-run" else args.repeat):
                    results.append(run_once(mode, tmp, cfg, n, local_server_url(tmp)))
                    print(f"  {mode} #{n + 1}: first step after {results[-1].first_step_s:.2f} s", flush=True)
        finally:
            stop_local_server(tmp)
    report(results, load_before, os.getloadavg(), args.samples)


def report(results: list[Timing], load_before: tuple[float, ...], load_after: tuple[float, ...],
           samples: int) -> None:
    """Per mode, the median of each figure (and the fastest first step): the host's load moves
    single runs by seconds."""
    base = [r.first_step_s for r in results if r.mode == "plain"]
    base_s = statistics.median(base) if base else None
    print(f"\ntime to first step, {samples}-sample BFCL batch, SQLite store, scripted engine with simulated timing; "
          f"{os.cpu_count()} cores, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; medians")
    print("| mode | runs | created s | running s | first step s (fastest) | exit s | first step / plain |")
    print("|---|---|---|---|---|---|---|")
    for mode in [m for m in MODES if any(r.mode == m for r in results)]:
        rs = [r for r in results if r.mode == mode]
        med = {f: statistics.median(getattr(r, f) for r in rs) for f in ("created_s", "running_s", "first_step_s",
                                                                          "exit_s")}
        ratio = f"{med['first_step_s'] / base_s:.2f}x" if base_s else "-"
        print(f"| {mode} | {len(rs)} | {med['created_s']:.2f} | {med['running_s']:.2f} | "
              f"**{med['first_step_s']:.2f}** ({min(r.first_step_s for r in rs):.2f}) | {med['exit_s']:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
