"""Live = virtual, measured: each synthetic family replayed live and in virtual time with one config.

Per family: a scaled trace (--samples), replayed
  live:    through the Prefect batch flow (`agentbatch replay --mode live`'s config: recorded
           environment, replay engine forced to the recorded output lengths) against two real-time
           `agentbatch serve-sim` worker processes, environment durations and engine speed both
           multiplied by one time scale (chosen so a family's live run takes about --target-s);
  virtual: `simulate()` of the same trace with the same scheduling config, on the same profile.
Live makespan (first admission to last finish, from the store) is divided by the time scale and
compared with the virtual makespan. Where the time went, per step (live divided by the scale):
engine service (inference start to finish, inside the engine incl. its own queue), environment
service, waits for a slot (enqueued to started), and the gap between a step's end and the sample's
next step being enqueued (orchestration: store, Prefect, event loop; zero in virtual time); of the
inference service, the engine's own time as it reports it (queue + prefill + decode; the rest is
HTTP, tokenizing the prompt and the client); prompt tokens and prefix-cache hits as each engine
counted them; and when samples start (their admission as the store records it, i.e. when a
sample's Prefect task run begins; in virtual time all admitted samples start at 0).

Usage: .venv/bin/python bench/live_vs_virtual.py [--families mcp_like,...] [--samples 16]
       [--target-s 80] [--env-slots 4] [--max-active 12]
Last line: `live/virtual makespan: worst R over families` (R = live / virtual; target 0.95-1.05).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

for _k, _v in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
               "PREFECT_LOGGING_TO_API_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
               "PREFECT_TASKS_DEFAULT_NO_CACHE": "true"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)

from agentbatch.flows.prefect_server import choose_api, stop_server, wait_ready  # noqa: E402

VENV_BIN = Path(sys.executable).parent


@dataclass
class Breakdown:
    """Per-step means in engine seconds, and token counts."""

    makespan_s: float
    inference_s: float  # mean inference service (start to finish)
    engine_s: float  # of which the engine's own time (its queue + prefill + decode, as it reports them)
    environment_s: float  # mean environment service
    inference_wait_s: float  # mean wait for an engine-worker slot
    environment_wait_s: float  # mean wait for an environment slot
    gap_s: float  # mean time from a step's end to the sample's next step being enqueued
    edges_s: float  # mean per sample: admission to its first step, plus its last step to its end (scoring)
    start_s: float  # mean sample start (admission recorded in the store) after the batch's first
    prompt_tokens: int
    cached_tokens: int

    def row(self) -> str:
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return (f"makespan {self.makespan_s:8.1f}  inf {self.inference_s:6.2f} (engine {self.engine_s:6.2f}, "
                f"wait {self.inference_wait_s:6.2f})  "
                f"env {self.environment_s:6.2f} (wait {self.environment_wait_s:6.2f})  gap {self.gap_s:6.3f}  "
                f"edges {self.edges_s:6.3f}  start {self.start_s:6.2f}  "
                f"prompt {self.prompt_tokens:>9,d} hit {hit:.3f}")  # fmt: skip


def breakdown(steps: list[Any], span: float, scale: float, edges: list[float], starts: list[float]) -> Breakdown:
    """steps: objects or rows with sample_id, index, kind, enqueued_at, started_at, finished_at, token counts."""
    inf = [s for s in steps if s.kind == "inference"]
    env = [s for s in steps if s.kind == "environment"]

    def m(xs: list[float]) -> float:
        return mean(xs) / scale if xs else 0.0

    return Breakdown(
        makespan_s=span / scale,
        inference_s=m(_service(inf)),
        engine_s=m([(s.engine_queue_s or 0.0) + (s.prefill_s or 0.0) + (s.decode_s or 0.0) for s in inf]),
        environment_s=m(_service(env)),
        inference_wait_s=m(_waits(inf)),
        environment_wait_s=m(_waits(env)),
        gap_s=m(_gaps(steps)),
        edges_s=m(edges),
        start_s=m([t - min(starts) for t in starts]),
        prompt_tokens=int(sum(s.prompt_tokens or 0 for s in inf)),
        cached_tokens=int(sum(s.cached_prompt_tokens or 0 for s in inf)),
    )


def _service(steps: list[Any]) -> list[float]:
    return [s.finished_at - s.started_at for s in steps]


def _waits(steps: list[Any]) -> list[float]:
    return [s.started_at - s.enqueued_at for s in steps]


def _gaps(steps: list[Any]) -> list[float]:
    """Per sample, from each step's end to its next step being enqueued."""
    by_sample: dict[int, list[Any]] = {}
    for s in sorted(steps, key=lambda s: (s.sample_id, s.index)):
        by_sample.setdefault(s.sample_id, []).append(s)
    return [b.enqueued_at - a.finished_at for rows in by_sample.values() for a, b in zip(rows, rows[1:], strict=False)]


def _edges(samples: Any, steps: Any) -> list[float]:
    """Per sample: from admission to its first step's enqueue plus from its last step's end to its end."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for s in steps:
        first[s.sample_id] = min(first.get(s.sample_id, s.enqueued_at), s.enqueued_at)
        last[s.sample_id] = max(last.get(s.sample_id, s.finished_at), s.finished_at)
    return [(first[s.id] - s.admitted_at) + (s.finished_at - last[s.id]) for s in samples if s.id in first]


# --- the two clocks -----------------------------------------------------------------------------
def replay_argv(trace: Path, args: argparse.Namespace, urls: list[str], scale: float, profile: str) -> list[str]:
    argv = ["replay", str(trace), "--mode", "live", "--engine", "openai", "--model", profile,
            "--time-scale", f"{scale:.6f}",
            "--max-active", str(args.max_active), "--env-slots", str(args.env_slots)]  # fmt: skip
    for url in urls:
        argv += ["--endpoint", url]
    return argv


def run_virtual(trace_path: Path, argv: list[str], profile: str) -> tuple[Breakdown, Any]:
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import POLICY_KINDS, _params
    from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
    from agentbatch.traces import read_trace

    a = build_parser().parse_args(argv)
    params = _params(a)
    cfg = VirtualConfig(workers=len(a.endpoint), profile=profile, max_active=a.max_active, env_slots=a.env_slots,
                        per_worker_inflight=a.per_worker_inflight, coupled=a.coupled,
                        admission_order=a.admission_order, priors={},
                        **{k: PolicySpec(getattr(a, k), params[k]) for k in POLICY_KINDS})  # fmt: skip
    r = simulate(read_trace(trace_path), cfg)
    frame = r.steps_frame()
    samples = list(r.samples_frame().itertuples())
    edges = _edges(samples, frame.itertuples())
    return breakdown(list(frame.itertuples()), r.summary.makespan_s, 1.0, edges, [s.admitted_at for s in samples]), r


def serve_sim(profile: str, scale: float, port: int, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(VENV_BIN / "agentbatch"), "serve-sim", "--profile", profile, "--time-scale", f"{scale:.6f}",
         "--port", str(port), "--workers-name", name],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def wait_health(url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"serve-sim at {url} did not answer /health")


def run_live(trace_path: Path, args: argparse.Namespace, profile: str, scale: float, db: str,
             ports: list[int]) -> tuple[Breakdown, list[str]]:
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import run_batch
    from agentbatch.flows.cli import build_parser
    from agentbatch.flows.commands.replay import _params, live_batch_config

    procs = [serve_sim(profile, scale, p, f"sim-{i}") for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    try:
        for url in urls:
            wait_health(url)
        a = build_parser().parse_args(replay_argv(trace_path, args, urls, scale, profile))
        config = live_batch_config(a, _params(a))
        store = Store(db)
        try:
            batch_id = run_batch(config, store, show_progress=False)
            samples = store.samples(batch_id)
            steps = [s for s in store.steps(batch_id) if s.status == "completed"]
        finally:
            store.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    failed = [s.index for s in samples if s.status != "completed"]
    if failed:
        raise RuntimeError(f"live replay: samples {failed} did not complete")
    span = max(s.finished_at for s in samples) - min(s.admitted_at for s in samples)
    edges = _edges(samples, steps)
    starts = [s.admitted_at for s in samples]
    return breakdown(steps, span, scale, edges, starts), replay_argv(trace_path, args, urls, scale, profile)


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main(argv: list[str] | None = None) -> int:
    from agentbatch.traces import FAMILIES, generate, write_trace

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--samples", type=int, default=16, help="samples per family")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target-s", type=float, default=80.0, help="wall seconds a family's live run should take")
    ap.add_argument("--env-slots", type=int, default=4)
    ap.add_argument("--max-active", type=int, default=12)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="live-vs-virtual-"))
    os.environ["AGENTBATCH_HOME"] = str(tmp)  # a Prefect server of this run only
    api = choose_api(start=True)
    if api.source == "started":
        wait_ready(api)
    print(f"# {api.describe()}; load average at start {os.getloadavg()}", flush=True)
    ratios: dict[str, float] = {}
    try:
        for family in args.families.split(","):
            ratios[family] = _family(family, args, tmp, generate, write_trace)
    finally:
        if api.source == "started":
            stop_server()
    print(f"# load average at end {os.getloadavg()}")
    print("| family | live/virtual makespan |\n|---|---|")
    for family, r in ratios.items():
        print(f"| {family} | {r:.3f} |")
    worst = max(ratios, key=lambda f: abs(ratios[f] - 1.0))
    print(f"live/virtual makespan: worst {ratios[worst]:.3f} over families ({worst})")
    return 0


def _family(family: str, args: argparse.Namespace, tmp: Path, generate: Any, write_trace: Any) -> float:
    from agentbatch.traces import FAMILIES

    profile = FAMILIES[family].capacities["profile"]
    trace = generate(family, args.samples, seed=args.seed)
    path = tmp / f"{family}.parquet"
    write_trace(trace, path)
    ports = _free_ports(2)
    probe = replay_argv(path, args, [f"http://127.0.0.1:{p}/v1" for p in ports], 1.0, profile)
    virtual, result = run_virtual(path, probe, profile)
    # One scale for engine speed and tool durations; > 1 slows a short family down to about
    # target_s, so that per-step orchestration stays as small beside real step times as in production.
    scale = args.target_s / max(virtual.makespan_s, 1e-9)
    t0 = time.perf_counter()
    live, _ = run_live(path, args, profile, scale, f"sqlite:///{tmp / (family + '.sqlite')}", ports)
    wall = time.perf_counter() - t0
    r = live.makespan_s / virtual.makespan_s
    print(f"## {family}: {args.samples} samples, {trace.num_steps} steps, profile {profile}, time scale {scale:.4f} "
          f"(live run {wall:.0f} s wall), LB {result.summary.lower_bound_s:.1f} s; load {os.getloadavg()[0]:.2f}")
    print(f"  live    {live.row()}")
    print(f"  virtual {virtual.row()}")
    print(f"  live/virtual makespan {r:.3f}", flush=True)
    return r


if __name__ == "__main__":
    sys.exit(main())
