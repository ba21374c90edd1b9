"""Scheduler decision cost at 10,000 active samples, for each queue policy, router and priority.

A queue decision is one pop (the next action to run) plus the push of that sample's next step, on a
queue holding one ticket per active sample; a routing decision is one `route` over the workers'
loads; a priority decision one `priority(sample)`. Target: < 50 us per decision. Ratios are against
the baseline policy (FIFO, round-robin, FCFS) measured in the same run.
Usage: .venv/bin/python bench/scheduler_cost.py [--active 10000] [--workers 8] [--decisions 100000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from agentbatch.scheduling.registry import (
    PRIORITIES,
    QUEUE_POLICIES,
    ROUTERS,
    make_priority,
    make_queue,
    make_router,
)
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad

TARGET_US = 50.0


def samples(n: int, workers: int, rng: random.Random) -> list[SampleProgress]:
    return [
        SampleProgress(sample_id=i, task_id=f"t{i % 500}", arrival_seq=i, steps_done=rng.randint(0, 60),
                       attained_s=rng.random() * 300, prior_chain_steps=rng.choice([None, rng.randint(4, 80)]),
                       last_worker=f"w{rng.randrange(workers)}")
        for i in range(n)
    ]  # fmt: skip


def bench_queue(name: str, active: int, decisions: int, seed: int) -> float:
    rng = random.Random(seed)
    ss = samples(active, 8, rng)
    q = make_queue(name)
    now = 0.0
    for s in ss:
        q.push(StepTicket(sample=s, kind=StepKind.ENVIRONMENT, step_index=s.steps_done, enqueued_at=now))
    t0 = time.perf_counter()
    for _ in range(decisions):
        now += 0.001
        t = q.pop(now)
        s = t.sample
        s.steps_done += 1
        s.attained_s += 0.5
        q.push(StepTicket(sample=s, kind=StepKind.ENVIRONMENT, step_index=s.steps_done, enqueued_at=now))
    return (time.perf_counter() - t0) / decisions * 1e6


def bench_router(name: str, active: int, workers: int, decisions: int, seed: int) -> float:
    rng = random.Random(seed)
    ss = samples(active, workers, rng)
    loads = [WorkerLoad(name=f"w{i}", in_flight=active // workers, capacity=256) for i in range(workers)]
    r = make_router(name)
    tickets = [StepTicket(sample=s, kind=StepKind.INFERENCE, step_index=2, enqueued_at=0.0) for s in ss]
    t0 = time.perf_counter()
    for k in range(decisions):
        w = r.route(tickets[k % active], loads)
        load = loads[int(w[1:])]
        load.in_flight += 1  # the chosen worker gets busier, another one finishes a request
        loads[k % workers].in_flight -= 1
    return (time.perf_counter() - t0) / decisions * 1e6


def bench_priority(name: str, active: int, decisions: int, seed: int) -> float:
    ss = samples(active, 8, random.Random(seed))
    p = make_priority(name)
    t0 = time.perf_counter()
    for k in range(decisions):
        p.priority(ss[k % active])
    return (time.perf_counter() - t0) / decisions * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--active", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--decisions", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"scheduler decision cost, {args.active} active samples, {args.workers} workers, "
          f"{args.decisions} decisions each (target < {TARGET_US:.0f} us)")  # fmt: skip
    worst = 0.0
    for kind, names, fn, base in (
        ("queue", QUEUE_POLICIES, lambda n: bench_queue(n, args.active, args.decisions, args.seed), "fifo"),
        ("router", ROUTERS, lambda n: bench_router(n, args.active, args.workers, args.decisions, args.seed),
         "round_robin"),
        ("priority", PRIORITIES, lambda n: bench_priority(n, args.active, args.decisions, args.seed), "fcfs"),
    ):  # fmt: skip
        results = {n: fn(n) for n in names}
        for n, us in results.items():
            worst = max(worst, us)
            ok = "ok" if us < TARGET_US else "OVER TARGET"
            print(f"  {kind:8s} {n:18s} {us:8.2f} us/decision   x{us / results[base]:.2f} of {base}   {ok}")
    print(f"worst {worst:.2f} us/decision: {'within' if worst < TARGET_US else 'above'} the {TARGET_US:.0f} us target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
