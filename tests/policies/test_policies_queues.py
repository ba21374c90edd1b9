"""CAAS and history-aware CAAS queues on hand-made cases; a plugin queue written to docs/plugins.md."""

from __future__ import annotations

import asyncio
import heapq
import random

import pytest

from agentbatch.scheduling.caas import CaasHistoryQueue, CaasQueue
from agentbatch.scheduling.policies import (
    AdmissionLimits,
    FcfsPriority,
    FifoQueue,
    QueuePolicy,
    RoundRobinRouter,
)
from agentbatch.scheduling.registry import make_queue
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.tasks.coordinator import Coordinator


def ticket(sid: int, steps: int = 0, attained: float = 0.0, arrival: int | None = None, at: float = 0.0,
           prior: float | None = None) -> StepTicket:
    s = SampleProgress(sample_id=sid, task_id=f"t{sid}", arrival_seq=sid if arrival is None else arrival,
                       steps_done=steps, attained_s=attained, prior_chain_steps=prior)
    return StepTicket(sample=s, kind=StepKind.ENVIRONMENT, step_index=steps, enqueued_at=at)


def drain(q, now: float = 0.0) -> list[int]:
    return [q.pop(now).sample.sample_id for _ in range(len(q))]


def test_caas_orders_by_steps_then_attained_then_arrival() -> None:
    q = CaasQueue(max_wait_s=None)
    for t in [ticket(1, steps=3), ticket(2, steps=5), ticket(3, steps=1), ticket(4, steps=3, attained=9.0),
              ticket(5, steps=3, arrival=0), ticket(6, steps=5)]:
        q.push(t)
    # 2 and 6: 5 steps (arrival 2 before 6); then 3 steps: 4 (more attained), 5 (arrival 0), 1; then 3
    assert drain(q) == [2, 6, 4, 5, 1, 3]


def test_caas_aging_guard_serves_a_starving_ticket_first() -> None:
    q = CaasQueue(max_wait_s=10.0)
    q.push(ticket(1, steps=0, at=0.0))  # little progress: would wait behind everyone
    for sid in range(2, 6):
        q.push(ticket(sid, steps=10, at=1.0))
    assert q.pop(5.0).sample.sample_id == 2  # not yet starving: progress order
    assert q.pop(10.5).sample.sample_id == 1  # waited 10.5 s > 10 s: goes first
    assert q.aged_pops == 1
    assert drain(q, 10.5) == [3, 4, 5]  # the aged ticket is not served twice
    assert len(q) == 0


def test_caas_remove_and_len() -> None:
    q = CaasQueue()
    ts = [ticket(i, steps=i) for i in range(5)]
    for t in ts:
        q.push(t)
    assert q.remove(ts[4]) and not q.remove(ts[4])
    assert len(q) == 4
    assert drain(q) == [3, 2, 1, 0]
    with pytest.raises(IndexError):
        q.pop(0.0)


def test_caas_matches_a_sort_at_scale() -> None:
    rng = random.Random(7)
    q = CaasQueue(max_wait_s=None)
    ts = [ticket(i, steps=rng.randint(0, 30), attained=round(rng.random() * 10, 1)) for i in range(10_000)]
    for t in ts:
        q.push(t)
    expect = [t.sample.sample_id for t in sorted(ts, key=lambda t: (-t.sample.steps_done, -t.sample.attained_s,
                                                                    t.sample.arrival_seq))]
    assert drain(q) == expect


def _history_case(q) -> list[int]:
    q.push(ticket(1, steps=10, prior=12))  # total 12, 2 left
    q.push(ticket(2, steps=2, prior=40))  # total 40, 38 left
    q.push(ticket(3, steps=20))  # no prior: after those with one, by observed progress
    q.push(ticket(4, steps=5))
    q.push(ticket(5, steps=30, prior=20))  # total 20, ran past its prior: 0 left
    return drain(q)


def test_history_caas_longest_expected_chain_first_unknown_last() -> None:
    assert _history_case(CaasHistoryQueue(max_wait_s=None)) == [2, 5, 1, 3, 4]
    assert _history_case(CaasHistoryQueue(max_wait_s=None, rank="remaining")) == [2, 1, 5, 3, 4]
    q = CaasHistoryQueue(max_wait_s=None, unknown_last=False)
    q.push(ticket(1, steps=10, prior=12))
    q.push(ticket(3, steps=20))
    assert drain(q) == [3, 1]
    with pytest.raises(ValueError):
        CaasHistoryQueue(rank="shortest")


def test_registry_builds_queues_with_params() -> None:
    q = make_queue("caas", max_wait_s=5.0)
    assert isinstance(q, CaasQueue) and q.max_wait_s == 5.0
    assert isinstance(make_queue("caas_history"), CaasHistoryQueue)
    with pytest.raises(ValueError, match="unknown queue policy"):
        make_queue("nope")
    with pytest.raises(TypeError, match="made a RoundRobinRouter, not a QueuePolicy"):
        make_queue(RoundRobinRouter)  # a resolved plugin of the wrong role is refused when built


class FewestStepsQueue(QueuePolicy):
    """A queue as docs/plugins.md shows one: `_push`, `pop(now)`, `__len__` and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, int, StepTicket]] = []

    def _push(self, ticket: StepTicket) -> None:
        heapq.heappush(self._heap, (ticket.sample.steps_done, ticket.seq, ticket))

    def pop(self, now: float) -> StepTicket:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)


def test_default_remove_drops_one_ticket_and_keeps_the_order() -> None:
    q = FewestStepsQueue()
    ts = [ticket(i, steps=s) for i, s in enumerate([4, 1, 3, 1, 0])]
    for t in ts:
        q.push(t)
    assert q.remove(ts[1]) and not q.remove(ts[1])
    assert len(q) == 4
    q.push(ticket(9, steps=1))  # after the removal, behind sample 3 (same steps, pushed later)
    assert drain(q) == [4, 3, 9, 2, 0]
    assert not q.remove(ts[0])  # an empty queue: nothing to drop


def test_a_docs_plugin_queue_survives_a_cancelled_waiter() -> None:
    async def scenario() -> list[int]:
        limits = AdmissionLimits(max_active_samples=8, env_slots=1, per_worker_inflight=1)
        coord = Coordinator.with_policies(limits=limits, workers=["w0"], env_queue=FewestStepsQueue(),
                                          inference_queues={"w0": FifoQueue()}, router=RoundRobinRouter(),
                                          priority=FcfsPriority())
        env = [StepTicket(sample=SampleProgress(i, f"t{i}", i), kind=StepKind.ENVIRONMENT, step_index=1,
                          enqueued_at=0.0) for i in range(3)]
        held = await coord.acquire(env[0])
        granted: list[int] = []

        async def wait(t: StepTicket) -> None:
            slot = await coord.acquire(t)
            granted.append(t.sample.sample_id)
            coord.release(t, slot)

        cancelled, kept = asyncio.create_task(wait(env[1])), asyncio.create_task(wait(env[2]))
        await asyncio.sleep(0)  # both are queued behind the held slot
        assert coord.core.queued()["environment"] == 2
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert coord.core.queued()["environment"] == 1
        coord.release(env[0], held)
        await kept
        return granted

    assert asyncio.run(scenario()) == [2]
