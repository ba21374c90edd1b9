"""The in-process coordinator: admission, engine-worker slots and environment slots.

It owns the limits and the waiting queues; *which* waiting item goes next is asked of the policy
objects from `agentbatch.scheduling` (queue policies, router, priority). It runs on one asyncio
event loop and does no I/O, so the same object serves the Prefect task runner (steps mode), the
lean mode and the plain-asyncio baseline of the overhead benchmark.

Coupled mode (the baseline, like inspect_ai's `max_sandboxes`): a sample takes an environment slot
when admitted and keeps it to its end; its environment steps then need no further slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentbatch.scheduling.policies import AdmissionLimits, FifoQueue, PriorityPolicy, QueuePolicy, Router
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad


@dataclass
class GateStats:
    peak_in_use: int = 0
    granted: int = 0
    waited: int = 0


class _Gate:
    """A pool of named slots with a waiting queue ordered by a QueuePolicy."""

    def __init__(self, name: str, slots: Sequence[str], policy: QueuePolicy, clock: Callable[[], float]):
        self.name = name
        self.capacity = len(slots)
        self.free: list[str] = list(reversed(slots))
        self.policy = policy
        self.clock = clock
        self.waiters: dict[int, asyncio.Future[str]] = {}
        self.stats = GateStats()

    @property
    def in_use(self) -> int:
        return self.capacity - len(self.free)

    @property
    def queued(self) -> int:
        return len(self.policy)

    def _grant(self) -> str:
        slot = self.free.pop()
        self.stats.granted += 1
        self.stats.peak_in_use = max(self.stats.peak_in_use, self.in_use)
        return slot

    async def acquire(self, ticket: StepTicket) -> str:
        if self.free and not len(self.policy):
            return self._grant()
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.policy.push(ticket)
        self.waiters[ticket.seq] = future
        self.stats.waited += 1
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())  # granted just before the cancel: give it back
            else:
                self.waiters.pop(ticket.seq, None)
                self.policy.remove(ticket)
            raise

    def release(self, slot: str) -> None:
        self.free.append(slot)
        while self.free and len(self.policy):
            ticket = self.policy.pop(self.clock())
            future = self.waiters.pop(ticket.seq, None)
            if future is None or future.done():
                continue
            future.set_result(self._grant())


@dataclass
class Coordinator:
    limits: AdmissionLimits
    workers: list[str]
    env_queue: QueuePolicy
    inference_queues: dict[str, QueuePolicy]
    router: Router
    priority: PriorityPolicy
    clock: Callable[[], float] = time.monotonic
    # Adds what the coordinator cannot see (real KV usage and queue lengths from the workers'
    # /metrics) to the router's view of the workers.
    load_hook: Callable[[list[WorkerLoad]], list[WorkerLoad]] | None = None
    moves: int = 0  # inference calls routed away from the sample's previous worker
    sticky: int = 0  # inference calls routed back to the sample's previous worker
    _cached: dict[str, set[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("the coordinator needs at least one engine worker")
        self._admission = _Gate(
            "admission", [f"active-{i}" for i in range(self.limits.effective_active())], FifoQueue(), self.clock
        )
        self._env = _Gate("environment", [f"env-{i}" for i in range(self.limits.env_slots)], self.env_queue,
                          self.clock)
        self._workers = {
            w: _Gate(w, [f"{w}#{i}" for i in range(self.limits.per_worker_inflight)], self.inference_queues[w],
                     self.clock)
            for w in self.workers
        }
        self._cached = {w: set() for w in self.workers}
        self._held_env: dict[int, str] = {}  # coupled mode: sample id -> its environment slot
        self._admitted: dict[int, str] = {}  # sample id -> its admission slot

    # --- samples ------------------------------------------------------------------------------------
    async def admit(self, sample: SampleProgress) -> None:
        ticket = StepTicket(sample=sample, kind=StepKind.INFERENCE, step_index=-1, enqueued_at=self.clock())
        slot = await self._admission.acquire(ticket)
        if self.limits.coupled:
            try:
                self._held_env[sample.sample_id] = await self._env.acquire(ticket)
            except BaseException:
                self._admission.release(slot)
                raise
        self._admitted[sample.sample_id] = slot

    def finish(self, sample: SampleProgress) -> None:
        self._admission.release(self._admitted.pop(sample.sample_id))
        if self.limits.coupled:
            self._env.release(self._held_env.pop(sample.sample_id))
        for cached in self._cached.values():
            cached.discard(sample.sample_id)

    # --- steps --------------------------------------------------------------------------------------
    def worker_loads(self) -> list[WorkerLoad]:
        loads = [
            WorkerLoad(name=w, in_flight=g.in_use, queued=g.queued, capacity=g.capacity,
                       cached_samples=self._cached[w])
            for w, g in self._workers.items()
        ]
        return self.load_hook(loads) if self.load_hook else loads

    async def acquire(self, ticket: StepTicket) -> str:
        """Wait for the resource the step needs; returns its slot name ("env-3", "worker-0#5").
        For inference steps the chosen worker is left in `ticket.worker`."""
        if ticket.kind == StepKind.ENVIRONMENT:
            if self.limits.coupled:
                return self._held_env[ticket.sample.sample_id]
            return await self._env.acquire(ticket)
        worker = self.router.route(ticket, self.worker_loads())
        previous = ticket.sample.last_worker
        if previous is not None:
            if previous == worker:
                self.sticky += 1
            else:
                self.moves += 1
        ticket.worker = worker
        return await self._workers[worker].acquire(ticket)

    def release(self, ticket: StepTicket, slot: str) -> None:
        if ticket.kind == StepKind.ENVIRONMENT:
            if not self.limits.coupled:
                self._env.release(slot)
            return
        worker = ticket.worker
        assert worker is not None, "an inference ticket is released after acquire() routed it"
        self._workers[worker].release(slot)
        # The worker that served the call now holds the sample's prefix; the others' copies go stale.
        for w, cached in self._cached.items():
            if w == worker:
                cached.add(ticket.sample.sample_id)
            else:
                cached.discard(ticket.sample.sample_id)
        ticket.sample.last_worker = worker

    def request_priority(self, sample: SampleProgress) -> int | None:
        return self.priority.priority(sample)

    # --- observation (tests, benchmarks, analytics) -----------------------------------------------------
    def peaks(self) -> dict[str, int]:
        out = {"admission": self._admission.stats.peak_in_use, "environment": self._env.stats.peak_in_use}
        out.update({w: g.stats.peak_in_use for w, g in self._workers.items()})
        return out

    def in_use(self) -> dict[str, int]:
        out = {"admission": self._admission.in_use, "environment": self._env.in_use}
        out.update({w: g.in_use for w, g in self._workers.items()})
        return out
