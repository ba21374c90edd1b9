"""One scheduling core, two clocks: the live asyncio driver and the virtual-time driver make the same
decisions.

The same trace with deterministic durations runs (a) through the live `Coordinator` on a real asyncio
event loop whose clock jumps to the next timer instead of sleeping (every `asyncio.sleep` is a real
timer; nothing is mocked), each sample a coroutine that acquires, sleeps its step's duration and
releases, as the flow's chains do; and (b) through `VirtualBatch` on its event heap with inference
taking the recorded durations. Both must grant every resource (admission, environment slots, each
engine worker) to the same steps in the same order at the same times, and run every sample's steps.

A deliberately broken live driver (it hands each freed slot to the longest-waiting ticket instead of
the one the core chose) must fail the same comparison.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections import defaultdict
from dataclasses import replace

import pytest

from agentbatch.scheduling.admission_order import admission_sequence
from agentbatch.scheduling.core import ADMISSION, ENVIRONMENT, Grant
from agentbatch.scheduling.registry import build_core
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.tasks.coordinator import Coordinator
from agentbatch.traces import generate
from agentbatch.traces.schema import INFERENCE, Trace, TraceSample

Starts = dict[str, list[tuple[int, int, float]]]  # resource -> (sample id, step index, time) in grant order


class FastClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock: when it would wait for the next timer it jumps there."""

    def __init__(self) -> None:
        self.now = 0.0
        loop = self

        class JumpSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
            def select(self, timeout: float | None = None):  # type: ignore[no-untyped-def]
                if timeout is None:
                    raise RuntimeError("deadlock: nothing ready and no timer pending")
                loop.now += max(0.0, timeout)
                return super().select(0)

        super().__init__(JumpSelector())

    def time(self) -> float:
        return self.now


def _trace(seed: int, samples: int = 24) -> Trace:
    """A synthetic trace with random, distinct step durations (no two events at one instant)."""
    trace = generate("mcp_like", samples, seed=seed)
    rng = random.Random(seed)
    for s in trace.samples:
        for st in s.steps:
            st.duration_s = rng.uniform(0.05, 1.0) if st.kind == INFERENCE else rng.uniform(0.2, 3.0)
    return trace


CONFIG = VirtualConfig(workers=2, max_active=10, env_slots=3, per_worker_inflight=2, inference="recorded",
                       router=PolicySpec("trajectory_aware", {"balance_abs": 1, "balance_rel": 1.0}),
                       env_queue=PolicySpec("caas"), inference_queue=PolicySpec("caas"),
                       priority=PolicySpec("chain_progress"), record_grants=True)  # fmt: skip


def _same_resource(ticket: StepTicket, resource: str) -> bool:
    if resource == ADMISSION:
        return ticket.step_index < 0
    if resource == ENVIRONMENT:
        return ticket.step_index >= 0 and ticket.kind == StepKind.ENVIRONMENT
    return ticket.step_index >= 0 and ticket.worker == resource


class FifoWakeCoordinator(Coordinator):
    """Broken on purpose: wakes the longest-waiting ticket of a resource, ignoring the core's choice."""

    def _deliver(self, grants: list[Grant], own: StepTicket | None = None) -> str | None:
        fixed = []
        for g in grants:
            if g.ticket is not own:
                oldest = next((t for t, _ in self._waiters.values() if _same_resource(t, g.resource)), None)
                g = Grant(oldest, g.resource, g.slot) if oldest is not None else g
            fixed.append(g)
        return super()._deliver(fixed, own)


async def _live_batch(trace: Trace, cfg: VirtualConfig, driver: type[Coordinator]) -> Starts:
    loop = asyncio.get_running_loop()
    names = [f"sim-{i}" for i in range(cfg.workers)]
    core = build_core(cfg.limits(cfg.engine_profile()), names, env_queue=cfg.env_queue,
                      inference_queue=cfg.inference_queue, router=cfg.router, priority=cfg.priority)  # fmt: skip
    coord = driver(core, clock=loop.time)
    starts: Starts = defaultdict(list)

    async def run(s: TraceSample, prog: SampleProgress) -> None:
        await coord.admit(prog)
        starts[ADMISSION].append((s.index, -1, loop.time()))
        for st in s.steps:
            kind = StepKind.INFERENCE if st.kind == INFERENCE else StepKind.ENVIRONMENT
            ticket = StepTicket(sample=prog, kind=kind, step_index=st.index, enqueued_at=loop.time(),
                                prompt_tokens=int(st.prompt_tokens or 0))  # fmt: skip
            slot = await coord.acquire(ticket)
            resource = ENVIRONMENT if kind == StepKind.ENVIRONMENT else ticket.worker
            starts[resource].append((s.index, st.index, loop.time()))
            await asyncio.sleep(st.duration_s)
            coord.release(ticket, slot)
            if st.done:
                break
        coord.finish(prog)

    progress = {s.index: SampleProgress(sample_id=s.index, task_id=s.task_id, arrival_seq=s.index,
                                        prior_chain_steps=(cfg.priors or {}).get(s.task_id))
                for s in trace.samples}  # fmt: skip
    by_id = {s.index: s for s in trace.samples}
    order = admission_sequence(list(progress.values()), cfg.admission_order)
    await asyncio.gather(*(run(by_id[p.sample_id], p) for p in order))
    return starts


def run_live(trace: Trace, cfg: VirtualConfig, driver: type[Coordinator] = Coordinator) -> Starts:
    loop = FastClockLoop()
    try:
        return loop.run_until_complete(_live_batch(trace, cfg, driver))
    finally:
        loop.close()


def run_virtual(trace: Trace, cfg: VirtualConfig) -> Starts:
    result = simulate(trace, cfg)
    starts: Starts = defaultdict(list)
    for g in result.raw.grants:
        starts[g.resource].append((g.sample_id, g.step_index, g.at))
    return starts


def parity_problems(live: Starts, virtual: Starts) -> list[str]:
    """Where the two runs differ: per resource, the order of grants and their times."""
    problems = []
    for resource in sorted(set(live) | set(virtual)):
        a, b = live.get(resource, []), virtual.get(resource, [])
        if [x[:2] for x in a] != [x[:2] for x in b]:
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x[:2] != y[:2]), min(len(a), len(b)))
            problems.append(f"{resource}: grant order differs from #{first} ({len(a)} live, {len(b)} virtual)")
        elif any(abs(x[2] - y[2]) > 1e-6 for x, y in zip(a, b, strict=True)):
            problems.append(f"{resource}: grant times differ")
    return problems


def _steps_per_sample(starts: Starts) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for resource, rows in starts.items():
        if resource != ADMISSION:
            for sample_id, _, _ in rows:
                out[sample_id] += 1
    return dict(out)


CASES = {
    "coordinated": CONFIG,
    "history": replace(CONFIG, env_queue=PolicySpec("caas_history"), admission_order="longest_prior_first",
                       priority=PolicySpec("chain_progress", {"use_prior": True})),
    "coupled_fifo_rr": replace(CONFIG, coupled=True, env_queue=PolicySpec("fifo"), router=PolicySpec("round_robin"),
                               inference_queue=PolicySpec("fifo"), priority=PolicySpec("fcfs")),
    "least_loaded": replace(CONFIG, router=PolicySpec("least_loaded"), max_active=24, env_slots=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_live_and_virtual_grant_the_same_steps_in_the_same_order(case: str) -> None:
    trace = _trace(seed=3)
    cfg = CASES[case]
    if case == "history":
        cfg = replace(cfg, priors={s.task_id: float(len(s.steps)) for s in trace.samples})
    live, virtual = run_live(trace, cfg), run_virtual(trace, cfg)
    assert parity_problems(live, virtual) == []
    assert _steps_per_sample(live) == _steps_per_sample(virtual) == {s.index: len(s.steps) for s in trace.samples}
    assert len(live[ADMISSION]) == len(trace.samples)
    assert len(live[ENVIRONMENT]) > 0 and all(len(live[w]) > 0 for w in ("sim-0", "sim-1"))


def test_a_broken_live_driver_fails_the_parity_check() -> None:
    trace = _trace(seed=3)
    broken = run_live(trace, CONFIG, FifoWakeCoordinator)
    problems = parity_problems(broken, run_virtual(trace, CONFIG))
    assert problems, "a driver that ignores the core's choice must not pass the parity check"
    assert any(p.startswith(ENVIRONMENT) for p in problems)
