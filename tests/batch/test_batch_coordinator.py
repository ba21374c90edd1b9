"""The coordinator never lets more run than allowed, and honours coupled mode."""

from __future__ import annotations

import asyncio
import random

from agentbatch.scheduling.policies import AdmissionLimits, FcfsPriority, FifoQueue, RoundRobinRouter
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.coordinator import Coordinator


def make(limits: AdmissionLimits, workers=("w0", "w1")) -> Coordinator:
    return Coordinator.with_policies(limits=limits, workers=list(workers), env_queue=FifoQueue(),
                                     inference_queues={w: FifoQueue() for w in workers},
                                     router=RoundRobinRouter(), priority=FcfsPriority())


async def chains(coord: Coordinator, samples: int, steps: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    live = {"admission": 0, "environment": 0, "w0": 0, "w1": 0}
    peak = dict(live)

    def enter(key: str) -> None:
        live[key] += 1
        peak[key] = max(peak[key], live[key])

    async def sample(i: int) -> None:
        p = SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i)
        await coord.admit(p)
        enter("admission")
        for k in range(steps):
            kind = StepKind.INFERENCE if k % 2 == 0 else StepKind.ENVIRONMENT
            t = StepTicket(sample=p, kind=kind, step_index=k, enqueued_at=0.0)
            slot = await coord.acquire(t)
            key = "environment" if kind == StepKind.ENVIRONMENT else t.worker
            enter(key)
            await asyncio.sleep(rng.random() * 0.003)
            live[key] -= 1
            coord.release(t, slot)
        live["admission"] -= 1
        coord.finish(p)

    await asyncio.gather(*(sample(i) for i in range(samples)))
    assert all(v == 0 for v in live.values())
    return peak


def test_limits_never_exceeded() -> None:
    limits = AdmissionLimits(max_active_samples=12, env_slots=3, per_worker_inflight=2)
    coord = make(limits)
    peak = asyncio.run(chains(coord, samples=40, steps=8))
    assert peak["admission"] == 12
    assert peak["environment"] == 3
    assert peak["w0"] <= 2 and peak["w1"] <= 2
    assert coord.peaks()["environment"] == 3


def test_coupled_mode_caps_active_samples_at_env_slots() -> None:
    limits = AdmissionLimits(max_active_samples=12, env_slots=3, per_worker_inflight=4, coupled=True)
    peak = asyncio.run(chains(make(limits), samples=20, steps=6))
    assert peak["admission"] == 3
    assert peak["environment"] <= 3


def test_fifo_grants_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        coord = make(AdmissionLimits(max_active_samples=10, env_slots=1, per_worker_inflight=1))
        order: list[int] = []
        first = StepTicket(sample=SampleProgress(0, "t", 0), kind=StepKind.ENVIRONMENT, step_index=1,
                           enqueued_at=0)
        held = await coord.acquire(first)

        async def wait(i: int) -> None:
            t = StepTicket(sample=SampleProgress(i, "t", i), kind=StepKind.ENVIRONMENT, step_index=1,
                           enqueued_at=0)
            slot = await coord.acquire(t)
            order.append(i)
            coord.release(t, slot)

        waiters = [asyncio.create_task(wait(i)) for i in range(1, 6)]
        await asyncio.sleep(0)
        coord.release(first, held)
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 5]


def test_cancelled_waiter_gives_no_slot_away() -> None:
    async def scenario() -> int:
        coord = make(AdmissionLimits(max_active_samples=4, env_slots=1, per_worker_inflight=1))
        a = StepTicket(sample=SampleProgress(0, "t", 0), kind=StepKind.ENVIRONMENT, step_index=1, enqueued_at=0)
        slot = await coord.acquire(a)
        b = StepTicket(sample=SampleProgress(1, "t", 1), kind=StepKind.ENVIRONMENT, step_index=1, enqueued_at=0)
        waiter = asyncio.create_task(coord.acquire(b))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        coord.release(a, slot)
        return coord.in_use()["environment"]

    assert asyncio.run(scenario()) == 0


def test_admission_limit_changes_while_the_batch_runs() -> None:
    async def scenario() -> list[tuple[str, int]]:
        coord = make(AdmissionLimits(max_active_samples=2, env_slots=2, per_worker_inflight=1))
        events: list[tuple[str, int]] = []
        samples = [SampleProgress(i, f"t{i}", i) for i in range(6)]

        async def admit(p: SampleProgress) -> None:
            await coord.admit(p)
            events.append(("admitted", p.sample_id))

        tasks = [asyncio.create_task(admit(p)) for p in samples]
        await asyncio.sleep(0)
        assert [e[1] for e in events] == [0, 1] and coord.in_use()["admission"] == 2
        coord.set_admission_limit(4)  # grows: two waiting samples are admitted at once
        await asyncio.sleep(0)
        assert [e[1] for e in events] == [0, 1, 2, 3]
        coord.set_admission_limit(1)  # shrinks: nothing running stops; finishing samples free no slot
        for p in samples[:3]:
            coord.finish(p)
            events.append(("finished", p.sample_id))
        await asyncio.sleep(0)
        assert coord.in_use()["admission"] == 1 and len([e for e in events if e[0] == "admitted"]) == 4
        coord.finish(samples[3])  # below the limit now: the next waiter goes in
        await asyncio.gather(tasks[4])
        assert coord.core.admission_limit == 1 and coord.in_use()["admission"] == 1
        tasks[5].cancel()
        return events

    events = asyncio.run(scenario())
    assert [sid for kind, sid in events if kind == "admitted"] == [0, 1, 2, 3, 4]


def test_progress_is_counted_by_the_core_on_release() -> None:
    async def scenario() -> SampleProgress:
        coord = make(AdmissionLimits(max_active_samples=1, env_slots=1, per_worker_inflight=1))
        p = SampleProgress(0, "t", 0)
        await coord.admit(p)
        for k in range(4):
            kind = StepKind.INFERENCE if k % 2 == 0 else StepKind.ENVIRONMENT
            t = StepTicket(sample=p, kind=kind, step_index=k, enqueued_at=0.0)
            slot = await coord.acquire(t)
            await asyncio.sleep(0.01)
            coord.release(t, slot)
        coord.finish(p)
        return p

    p = asyncio.run(scenario())
    assert p.steps_done == 4 and p.attained_s >= 0.04  # grant to release, summed
    assert p.last_worker in ("w0", "w1")


def test_thousands_of_waiters_cancelled_at_once_give_their_grants_back() -> None:
    """A run stopped with thousands of samples waiting for one slot: each grant to a cancelled waiter
    goes back and frees the next, thousands deep, without recursion, and the slot ends free."""
    coord = make(AdmissionLimits(max_active_samples=5000, env_slots=1, per_worker_inflight=1))

    async def main() -> None:
        holder = SampleProgress(sample_id=0, task_id="t0", arrival_seq=0)
        await coord.admit(holder)
        held = StepTicket(sample=holder, kind=StepKind.ENVIRONMENT, step_index=0, enqueued_at=0.0)
        slot = await coord.acquire(held)
        progress = [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i) for i in range(1, 3001)]
        for p in progress:
            await coord.admit(p)
        tickets = [StepTicket(sample=p, kind=StepKind.ENVIRONMENT, step_index=0, enqueued_at=0.0) for p in progress]
        waiting = [asyncio.ensure_future(coord.acquire(t)) for t in tickets]
        await asyncio.sleep(0)  # every waiter queued
        for w in waiting:
            w.cancel()  # their futures are cancelled at once; their except clauses run later
        coord.release(held, slot)  # the grant goes from cancelled waiter to cancelled waiter
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert coord.capacities()["environment"] == (1, 0)

    asyncio.run(main())


def test_stopped_admission_stays_stopped_when_the_limit_grows() -> None:
    """--fail-on-error stops admission: neither a freed slot nor an admission controller raising the
    limit admits a waiting sample afterwards; an admitted sample runs on."""
    coord = make(AdmissionLimits(max_active_samples=1, env_slots=1, per_worker_inflight=1))

    async def main() -> None:
        first, second = (SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i) for i in range(2))
        await coord.admit(first)
        waiting = asyncio.ensure_future(coord.admit(second))
        await asyncio.sleep(0)
        coord.stop_admission()
        step = StepTicket(sample=first, kind=StepKind.ENVIRONMENT, step_index=0, enqueued_at=0.0)
        coord.release(step, await coord.acquire(step))  # the admitted sample still gets its steps
        coord.set_admission_limit(5)
        coord.finish(first)
        await asyncio.sleep(0.01)
        assert not waiting.done() and coord.waiting_admission == 1
        waiting.cancel()

    asyncio.run(main())
