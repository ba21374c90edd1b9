"""Speed and behaviour of the simulated engine model (agentbatch.sim).

    .venv/bin/python bench/sim_engine.py [--quick]

1. Model speed on an agent-like closed loop (samples x steps, contexts that grow by each turn):
   iterations/s, requests/s and simulated tokens/s per wall second, and simulated seconds per wall
   second (the speed-up over real time).
2. Throughput against concurrency for each profile (fixed 1024-token prompts, 128 output tokens,
   as `vllm bench serve --random-input-len 1024 --random-output-len 128 --ignore-eos`): output
   tokens/s, mean time per output token and the ratio to concurrency 1 measured in the same run.
"""

from __future__ import annotations

import argparse
import random
import time

from agentbatch.sim import PROFILES, EngineModel, SimRequest, get_profile


def agent_loop(
    profile_name: str, samples: int, steps: int, concurrency: int, seed: int = 0
) -> dict[str, float]:
    """Closed loop: `concurrency` samples in flight; each turn's prompt extends the previous one."""
    model = EngineModel(get_profile(profile_name), policy="priority")
    rng = random.Random(seed)
    system = list(range(2000))
    prompts: dict[int, list[int]] = {}
    step: dict[int, int] = {}
    fresh = 10_000_000
    next_sample = done = active = requests = iterations = 0
    now = 0.0
    start = time.perf_counter()
    while done < samples:
        while active < concurrency and next_sample < samples:
            s = next_sample
            prompts[s] = system + list(range(fresh, fresh + 300))
            fresh += 300
            step[s] = 0
            model.add_request(SimRequest(f"{s}:0", s, prompts[s], rng.randrange(50, 300)), now)
            requests += 1
            next_sample += 1
            active += 1
        res = model.run_iteration(now)
        now += res.duration
        iterations += 1
        for st in res.finished:
            s = st.sample_id
            step[s] += 1
            if step[s] >= steps:
                active -= 1
                done += 1
                model.forget_sample(s)
                del prompts[s]
                continue
            grow = rng.randrange(50, 300)  # the output and the tool observation of this turn
            # the context grows in place, as the virtual-time replay keeps it (the engine's memo
            # then sees the same list and skips comparing the prefix)
            prompts[s].extend(range(fresh, fresh + grow))
            fresh += grow
            model.add_request(SimRequest(f"{s}:{step[s]}", s, prompts[s], rng.randrange(50, 300)), now)
            requests += 1
    wall = time.perf_counter() - start
    m = model.metrics()
    tokens = m["prefill_tokens_total"] + m["generation_tokens_total"]
    return {
        "wall_s": wall,
        "requests": requests,
        "iterations": iterations,
        "it_per_s": iterations / wall,
        "req_per_s": requests / wall,
        "sim_tok_per_s": tokens / wall,
        "sim_s": now,
        "speedup": now / wall,
        "hit_rate": m["prefix_cache_hits_total"] / max(1.0, m["prefix_cache_queries_total"]),
        "preemptions": m["num_preemptions_total"],
    }


def throughput(
    profile_name: str, concurrency: int, n_requests: int, prompt: int = 1024, out: int = 128
) -> dict:
    """Closed loop of independent requests (no shared prefix) at a fixed concurrency."""
    model = EngineModel(get_profile(profile_name))
    now, sent, finished, fresh = 0.0, 0, [], 0
    while sent < min(concurrency, n_requests):
        model.add_request(SimRequest(f"r{sent}", sent, list(range(fresh, fresh + prompt)), out), now)
        fresh += prompt
        sent += 1
    while model.has_work():
        res = model.run_iteration(now)
        now += res.duration
        for st in res.finished:
            finished.append(st)
            if sent < n_requests:
                model.add_request(SimRequest(f"r{sent}", sent, list(range(fresh, fresh + prompt)), out), now)
                fresh += prompt
                sent += 1
    tpot = sum(s.decode_s / max(1, s.output_tokens - 1) for s in finished) / len(finished)
    return {
        "out_tok_s": len(finished) * out / now,
        "tpot_ms": tpot * 1e3,
        "ttft_ms": 1e3 * sum(s.queue_s + s.prefill_s for s in finished) / len(finished),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    args = ap.parse_args()
    samples = 200 if args.quick else 1000

    print("== model speed: agent closed loop (samples x 30 steps, 64 in flight, contexts 2.3k -> ~7k tokens)")
    print(
        f"{'profile':<22}{'requests':>9}{'wall s':>8}{'it/s':>9}{'req/s':>8}{'sim tok/s':>12}{'x real time':>12}{'hit rate':>9}"
    )
    for name in PROFILES:
        r = agent_loop(name, samples, 30, 64)
        print(
            f"{name:<22}{r['requests']:>9}{r['wall_s']:>8.2f}{r['it_per_s']:>9.0f}{r['req_per_s']:>8.0f}"
            f"{r['sim_tok_per_s']:>12.3g}{r['speedup']:>12.0f}{r['hit_rate']:>9.1%}"
        )

    print("\n== throughput against concurrency (1024-token prompts, 128 output tokens, no shared prefix)")
    for name, profile in PROFILES.items():
        levels = [c for c in (1, 4, 16, 64, 128, 256) if c <= profile.max_num_seqs] + [
            profile.max_num_seqs * 2
        ]
        base = None
        print(f"{name}: max_num_seqs {profile.max_num_seqs}, {profile.num_kv_blocks} blocks x {profile.block_size}"
              + (f", {profile.state_slots} state slots" if profile.state_slots else ""))  # fmt: skip
        print(f"  {'concurrency':>11}{'out tok/s':>11}{'TPOT ms':>9}{'TTFT ms':>9}{'x conc. 1':>10}")
        for c in sorted(set(levels)):
            r = throughput(name, c, n_requests=max(4 * c, 32) if not args.quick else max(2 * c, 16))
            base = base or r["out_tok_s"]
            print(
                f"  {c:>11}{r['out_tok_s']:>11.0f}{r['tpot_ms']:>9.2f}{r['ttft_ms']:>9.1f}{r['out_tok_s'] / base:>10.1f}"
            )


if __name__ == "__main__":
    main()
