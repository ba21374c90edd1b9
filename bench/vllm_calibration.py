"""Simulator vs real vLLM: calibrate the simulated engine on a real vLLM CPU worker, then compare.

1. Start one real vLLM CPU worker serving the tiny model (worker start time is printed).
2. Run a short controlled agent-like workload against it twice (different seeds): samples share a
   system prefix, each turn appends an observation and the previous answer, outputs are forced
   with `max_tokens` + `ignore_eos`, and the "environment" waits between turns. Prompts are sent as
   token ids (/v1/completions), so the simulator sees exactly the same tokens and prefixes.
   Per request: start, first token (streaming), finish, prompt / cached tokens.
3. Fit the simulated engine's cost model (agentbatch.sim.calibrate) on run A.
4. Replay both workloads in the simulator (closed loop: a sample's next turn arrives one recorded
   environment wait after its previous turn finished in the simulation) with the base profile and
   with the fitted one, and print the per-request latency error (median / p90 of |sim - real| / real)
   and the makespan error. Run B is held out from the fit.

Also prints the vLLM install time and size (from .ci/setup_vllm.sh's record) and the worker start time.
Run: .venv/bin/python bench/vllm_calibration.py [--samples 8 --turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

from agentbatch.engines.vllm_workers import WorkerCluster, WorkersConfig
from agentbatch.sim.calibrate import burst_delivered, fit_cost_model, timings_from_records
from agentbatch.sim.model import EngineModel, SimRequest
from agentbatch.sim.profiles import get_profile

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-vllm"
MODEL = REPO / ".cache" / "tiny-llama"
# Launch settings shared by the real worker and the simulated profile.
MAX_NUM_SEQS = 16
MAX_BATCHED = 2048
BLOCK = 128
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # K+V x 2 layers x 2 KV heads x head dim 32 x bf16
KV_BLOCKS = (1 << 30) // (BLOCK * KV_BYTES_PER_TOKEN)  # VLLM_CPU_KVCACHE_SPACE=1


@dataclass
class Turn:
    sample: int
    turn: int
    prompt: list[int]
    output_tokens: int
    gap_s: float  # environment time before this turn (0 for the first)


def make_workload(seed: int, samples: int, turns: int, prefix: int = 512) -> list[list[Turn]]:
    """Agent-like chains as token ids (ids >= 10 skip the tiny tokenizer's special tokens)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 4000) for _ in range(n)]

    system = ids(prefix)
    out: list[list[Turn]] = []
    for s in range(samples):
        context = system + ids(rng.randint(64, 384))
        chain = []
        for t in range(turns):
            n_out = rng.randint(32, 192)
            chain.append(Turn(s, t, list(context), n_out, 0.0 if t == 0 else rng.uniform(0.2, 0.8)))
            # The next prompt: this turn's answer (fixed ids, not the random model's text) + an observation.
            context = context + ids(n_out) + ids(rng.randint(32, 256))
        out.append(chain)
    return out


async def run_real(base_url: str, model: str, chains: list[list[Turn]]) -> tuple[list[dict], float]:
    """Each chain runs its turns in order, waiting gap_s before each; all chains at once."""
    records: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        t0 = time.time()

        async def one(turn: Turn) -> None:
            body = {"model": model, "prompt": turn.prompt, "max_tokens": turn.output_tokens, "min_tokens":
                    turn.output_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}
            start = time.time()
            first = None
            usage: dict = {}
            async with client.stream("POST", "/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and first is None and chunk["choices"][0].get("text") is not None:
                        first = time.time()
                    if chunk.get("usage"):
                        usage = chunk["usage"]
            end = time.time()
            details = usage.get("prompt_tokens_details") or {}
            records.append({
                "sample_id": turn.sample, "index": turn.turn, "worker": "w0",
                "prompt_tokens": usage.get("prompt_tokens", len(turn.prompt)),
                "cached_prompt_tokens": details.get("cached_tokens") or 0,
                "output_tokens": usage.get("completion_tokens", turn.output_tokens),
                "started_at": start - t0, "finished_at": end - t0,
                "prefill_s": (first or end) - start, "decode_s": end - (first or end),
            })

        async def chain(turns: list[Turn]) -> None:
            for turn in turns:
                if turn.gap_s:
                    await asyncio.sleep(turn.gap_s)
                await one(turn)

        await asyncio.gather(*(chain(c) for c in chains))
        return records, time.time() - t0


def run_sim(profile, chains: list[list[Turn]]) -> tuple[dict[tuple[int, int], float], float]:
    """Closed-loop replay in virtual time; returns {(sample, turn): latency} and the makespan."""
    model = EngineModel(profile, name="w0", policy="fcfs")
    pending: list[tuple[float, int, int]] = [(0.0, c[0].sample, 0) for c in chains]
    heapq.heapify(pending)
    by_id = {f"{t.sample}/{t.turn}": t for c in chains for t in c}
    latency: dict[tuple[int, int], float] = {}
    now = 0.0
    while pending or model.has_work():
        while pending and pending[0][0] <= now:
            at, s, k = heapq.heappop(pending)
            t = chains[s][k]
            model.add_request(SimRequest(f"{s}/{k}", s, t.prompt, t.output_tokens, arrival=at), at)
        if not model.has_work():
            now = pending[0][0]
            continue
        res = model.run_iteration(now)
        now += res.duration
        for st in res.finished:
            t = by_id[st.request_id]
            latency[(t.sample, t.turn)] = st.finished - st.arrival
            if t.turn + 1 < len(chains[t.sample]):
                heapq.heappush(pending, (st.finished + chains[t.sample][t.turn + 1].gap_s, t.sample, t.turn + 1))
    return latency, now


def errors(real: list[dict], sim: dict[tuple[int, int], float]) -> np.ndarray:
    return np.array([abs(sim[(r["sample_id"], r["index"])] - (r["finished_at"] - r["started_at"]))
                     / (r["finished_at"] - r["started_at"]) for r in real])


@dataclass
class RealRuns:
    chains_a: list[list[Turn]]
    chains_b: list[list[Turn]]
    real_a: list[dict]
    real_b: list[dict]


def print_install(py: Path) -> None:
    setup = VENV / "agentbatch-setup.json"
    info = json.loads(setup.read_text()) if setup.exists() else {}
    size = subprocess.run(["du", "-sb", str(VENV)], capture_output=True, text=True).stdout.split()[0]
    print(f"vLLM install: {info.get('install_s', '?')} s (vllm-cpu {info.get('vllm', '?')}, torch "
          f"{info.get('torch', '?')}+cpu), venv {int(size) / 1e9:.2f} GB; tiny model "
          f"{sum(f.stat().st_size for f in MODEL.iterdir()) / 1e6:.1f} MB")


def worker_config(py: Path, port: int) -> WorkersConfig:
    return WorkersConfig.model_validate({
        "model": str(MODEL), "served_model_name": "tiny", "python": str(py), "device": "cpu",
        "log_dir": str(REPO / ".agentbatch" / "bench-vllm"), "endpoints_file":
        str(REPO / ".agentbatch" / "bench-vllm" / "endpoints.json"), "workers": [{"name": "w0", "port": port}],
        "settings": {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_BATCHED, "block_size": BLOCK,
                     "max_model_len": 8192, "kv_cache_space_gib": 1},
    })


def run_real_workloads(cfg: WorkersConfig, samples: int, turns: int) -> RealRuns:
    """Start the worker, warm it up, run workloads A and B closed-loop, stop it."""
    cluster = WorkerCluster(cfg)
    t = time.perf_counter()
    (ep,) = cluster.up()
    print(f"worker start (process start -> /health 200): {time.perf_counter() - t:.1f} s")
    try:
        warm = make_workload(99, 2, 1)
        asyncio.run(run_real(ep.base_url, ep.model, warm))  # first requests pay one-off warm-up costs
        chains_a = make_workload(1, samples, turns)
        chains_b = make_workload(2, samples, turns)
        real_a, wall_a = asyncio.run(run_real(ep.base_url, ep.model, chains_a))
        real_b, wall_b = asyncio.run(run_real(ep.base_url, ep.model, chains_b))
    finally:
        cluster.down()
    print(f"load average {os.getloadavg()[0]:.1f} after the real runs; real makespans A {wall_a:.2f} s, B {wall_b:.2f} s")
    return RealRuns(chains_a, chains_b, real_a, real_b)


def fit_profile(runs: RealRuns):
    """Write the timings (`agentbatch calibrate` reads them) and fit the cost model to run A."""
    out_dir = REPO / ".agentbatch" / "bench-vllm"
    for name, rows in (("real_a", runs.real_a), ("real_b", runs.real_b)):
        pd.DataFrame(rows).to_csv(out_dir / f"{name}.csv", index=False)
    print(f"request timings written to {out_dir}/real_a.csv, real_b.csv")
    # The fit keeps only the total latency of requests whose stream came in one burst (calibrate.py).
    fit_rows = runs.real_a
    dropped = int(burst_delivered(timings_from_records(fit_rows)).sum())
    print(f"fit input: {len(fit_rows)} requests of run A; {dropped} with a burst-delivered stream kept as "
          "total latency only")
    base = get_profile("tiny-cpu", num_kv_blocks=KV_BLOCKS, max_num_seqs=MAX_NUM_SEQS,
                       max_num_batched_tokens=MAX_BATCHED, block_size=BLOCK)
    fit = fit_cost_model(timings_from_records(fit_rows), base)
    print(fit.to_text())
    if fit.coefficients["c0"] < 1e-4 or fit.coefficients["c_decode"] <= 0:
        print("WARNING: degenerate fit (no fixed or per-sequence step cost): the simulated engine will be "
              "far too fast; re-run, ideally on a quieter machine")
    return base, fit


def print_real_stats(rr: list[dict]) -> None:
    cached = sum(r["cached_prompt_tokens"] for r in rr)
    prompt = sum(r["prompt_tokens"] for r in rr)
    print(f"real runs: {len(rr)} requests, prefix-cache hits {cached / prompt:.1%} of prompt tokens")
    tpot = [r["decode_s"] / (r["output_tokens"] - 1) for r in rr if r["output_tokens"] > 1]
    print(f"real per request: time to first token p50 {np.median([r['prefill_s'] for r in rr]) * 1e3:.0f} ms, "
          f"time per output token p50 {np.median(tpot) * 1e3:.2f} ms (min {min(tpot) * 1e3:.2f}), latency p50 "
          f"{np.median([r['finished_at'] - r['started_at'] for r in rr]):.2f} s")


def compare(runs: RealRuns, base, fit) -> None:
    """Request and makespan errors of the base and the calibrated profile, on the fit run and the held-out one."""
    print(f"{'run':<16}{'profile':<22}{'req err p50':>12}{'req err p90':>12}{'makespan real':>15}"
          f"{'sim':>9}{'err':>8}")
    summary = {}
    for label, chains, real in (("A (fit)", runs.chains_a, runs.real_a), ("B (held out)", runs.chains_b, runs.real_b)):
        # The real makespan runs from the first request to the last token (same as the simulation's).
        real_span = max(r["finished_at"] for r in real)
        for pname, prof in (("base tiny-cpu", base), ("calibrated", fit.profile)):
            lat, span = run_sim(prof, chains)
            e = errors(real, lat)
            summary[(label, pname)] = (np.median(e), np.percentile(e, 90), abs(span - real_span) / real_span)
            print(f"{label:<16}{pname:<22}{np.median(e):>12.1%}{np.percentile(e, 90):>12.1%}"
                  f"{real_span:>14.2f}s{span:>8.2f}s{(span - real_span) / real_span:>+8.1%}")
    b_base, b_cal = summary[("B (held out)", "base tiny-cpu")], summary[("B (held out)", "calibrated")]
    print(f"held-out run B, calibrated vs base profile: median request error x{b_cal[0] / b_base[0]:.2f}, "
          f"makespan error x{b_cal[2] / max(b_base[2], 1e-9):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--port", type=int, default=8391)
    args = ap.parse_args()
    py = VENV / "bin" / "python"
    if not py.exists() or not (MODEL / "config.json").exists():
        print(f"needs {py} and {MODEL}: run .ci/setup_vllm.sh", file=sys.stderr)
        return 2
    print_install(py)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start "
          "(other processes share the cores: real timings are noisy under load)")
    runs = run_real_workloads(worker_config(py, args.port), args.samples, args.turns)
    base, fit = fit_profile(runs)
    print_real_stats(runs.real_a + runs.real_b)
    compare(runs, base, fit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
