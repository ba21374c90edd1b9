"""The live coordinator: the asyncio driver of the scheduling core.

Every decision (admission, engine-worker and environment slots, routing, CAAS, priorities,
progress) is made by `agentbatch.scheduling.core.SchedulingCore`, the state machine virtual time
drives too. This class only turns its grants into awaitable results on one event loop: a waiter
gets an asyncio future, and the core's grants resolve those futures in the order the core made
them. It serves the Prefect task runner (steps mode), the lean mode and the plain-asyncio baseline.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentbatch.scheduling.admission_control import EngineMeasurements
from agentbatch.scheduling.core import CountersHook, Grant, LoadHook, PolicySwap, SchedulingCore
from agentbatch.scheduling.policies import AdmissionLimits, PriorityPolicy, QueuePolicy, Router
from agentbatch.scheduling.types import SampleProgress, StepTicket, WorkerLoad


class Coordinator:
    """The asyncio face of one `SchedulingCore`: build the core first (`registry.build_core`, as
    virtual time does), then the coordinator over it."""

    def __init__(self, core: SchedulingCore, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.clock = clock
        self._waiters: dict[int, tuple[StepTicket, asyncio.Future[str]]] = {}  # id(ticket) -> waiter

    @classmethod
    def with_policies(
        cls,
        limits: AdmissionLimits,
        workers: list[str],
        env_queue: QueuePolicy,
        inference_queues: dict[str, QueuePolicy],
        router: Router,
        priority: PriorityPolicy,
        clock: Callable[[], float] = time.monotonic,
        *,
        record: bool = False,
    ) -> Coordinator:
        """A coordinator over a new core made of these policy objects (tests and hand-built drivers)."""
        return cls(SchedulingCore(limits, workers, env_queue, inference_queues, router, priority, record=record),
                   clock)

    # --- the core's state, as the public API names it ---------------------------------------------
    @property
    def limits(self) -> AdmissionLimits:
        return self.core.limits

    @property
    def workers(self) -> list[str]:
        return list(self.core.workers)

    @property
    def router(self) -> Router:
        return self.core.router

    @property
    def priority(self) -> PriorityPolicy:
        return self.core.priority

    @property
    def load_hook(self) -> LoadHook | None:
        return self.core.load_hook

    @load_hook.setter
    def load_hook(self, hook: LoadHook | None) -> None:
        self.core.load_hook = hook

    @property
    def engine_counters(self) -> CountersHook | None:
        """The engines' counters for adaptive admission (from the workers' /metrics)."""
        return self.core.engine_counters

    @engine_counters.setter
    def engine_counters(self, hook: CountersHook | None) -> None:
        self.core.engine_counters = hook

    @property
    def sticky(self) -> int:
        return self.core.sticky

    @property
    def moves(self) -> int:
        return self.core.moves

    # --- samples ------------------------------------------------------------------------------------
    async def admit(self, sample: SampleProgress, *, first: bool = False) -> None:
        """Wait for an admission slot; `first`: ahead of the samples waiting (one that yielded)."""
        await self._acquire(self.core.admission_ticket(sample, self.clock()), first=first)

    def yield_admission(self, sample: SampleProgress) -> None:
        """The sample gives its admission slot to a waiting one without ending (`admit(first=True)`
        takes one again)."""
        self._deliver(self.core.yield_admission(sample, self.clock()))

    @property
    def waiting_admission(self) -> int:
        return len(self.core.admission.queue)

    def finish(self, sample: SampleProgress) -> None:
        self._deliver(self.core.finish(sample, self.clock()))

    def stop_admission(self) -> None:
        """Admit no sample from now on, whatever limit is set later (`SchedulingCore.stop_admission`)."""
        self.core.stop_admission()

    def set_admission_limit(self, limit: int) -> None:
        """Change the admission limit while the batch runs (waiting samples are admitted at once
        when it grows; a lower limit takes effect as samples finish)."""
        self._deliver(self.core.set_admission_limit(limit, self.clock()))

    def swap(self, swap: PolicySwap) -> None:
        """Run the rest of the batch with other policies (re-planning while it runs, flows/replan.py):
        `SchedulingCore.swap` at this instant, its grants delivered."""
        self._deliver(self.core.swap(swap, self.clock()))

    @property
    def env_slots(self) -> int:
        """Environment actions that may run at once now."""
        return self.core.environment.capacity

    def set_env_slots(self, slots: int) -> None:
        """Change the environment slots while the batch runs (waiting actions start at once when they
        grow; fewer take effect as running actions end)."""
        self._deliver(self.core.set_env_slots(slots, self.clock()))

    def capacities(self) -> dict[str, tuple[int, int]]:
        """(capacity, in use) of each pool by name: `admission`, `environment` and each worker."""
        return {p.name: (p.capacity, p.in_use) for p in self.core.pools()}

    def set_capacities(self, capacities: Mapping[str, int]) -> None:
        """Resize pools by name (0 allowed), e.g. to this process's share of limits split among processes."""
        self._deliver(self.core.set_capacities(capacities, self.clock()))

    # --- steps --------------------------------------------------------------------------------------
    async def acquire(self, ticket: StepTicket) -> str:
        """Wait for the resource the step needs; returns its slot name ("env-3", "worker-0#5").
        For inference steps the chosen worker is left in `ticket.worker`."""
        return await self._acquire(ticket)

    def release(self, ticket: StepTicket, slot: str, *, completed: bool = True) -> None:
        """The step ended: the slot goes to the next waiter and, when it `completed`, the sample's
        progress advances (steps done + 1, attained service + the time since the grant). Callers
        do not count progress themselves."""
        now = self.clock()
        self._deliver(self.core.complete(ticket, slot, now) if completed else self.core.release(ticket, slot, now))

    def request_priority(self, sample: SampleProgress) -> int | None:
        return self.core.request_priority(sample)

    def worker_loads(self) -> list[WorkerLoad]:
        return self.core.worker_loads()

    # --- observation (tests, benchmarks, analytics) -------------------------------------------------
    def peaks(self) -> dict[str, int]:
        return self.core.peaks()

    def in_use(self) -> dict[str, int]:
        return self.core.in_use()

    # --- the driver ---------------------------------------------------------------------------------
    async def _acquire(self, ticket: StepTicket, *, first: bool = False) -> str:
        own = self._deliver(self.core.submit(ticket, self.clock(), first=first), own=ticket)
        if own is not None:
            return own
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters[id(ticket)] = (ticket, future)
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(id(ticket), None)
            if future.done() and not future.cancelled():  # granted just before the cancel: give it back
                self._deliver(self.core.release(ticket, future.result(), self.clock()))
            else:
                self.core.withdraw(ticket)
            raise

    def _deliver(self, grants: list[Grant], own: StepTicket | None = None) -> str | None:
        """Hand each grant to its waiter, in the core's order; returns the slot granted to `own`.
        A grant whose waiter is gone (cancelled) goes back, and what that frees is handed on in
        turn: a work list, not recursion (10,000 samples cancelled at once chain that many)."""
        mine = None
        pending = deque(grants)
        while pending:
            g = pending.popleft()
            if g.ticket is own:
                mine = g.slot
                continue
            _, future = self._waiters.pop(id(g.ticket), (None, None))
            if future is None or future.done():
                pending.extendleft(reversed(self.core.release(g.ticket, g.slot, self.clock())))  # first, as before
            else:
                future.set_result(g.slot)
        return mine


def counters_from_workers(snapshots: Iterable[Any]) -> EngineMeasurements:
    """Sum the workers' latest /metrics snapshots (`engines.metrics.WorkerMetrics`) for the admission
    controller. Recomputed tokens come from workers that export them (serve-sim, as the engine model
    gives them in virtual time); vLLM exports no such counter, so preemptions and the hit rate stand
    for it there."""
    snaps = [m for m in snapshots if m.ok]
    if not snaps:
        return EngineMeasurements()
    kv = [m.kv_cache_usage for m in snaps if m.kv_cache_usage is not None]
    recomputed = [m.recomputed_tokens for m in snaps]
    return EngineMeasurements(
        prompt_tokens=sum(m.prefix_cache_queries for m in snaps),
        cached_tokens=sum(m.prefix_cache_hits for m in snaps),
        preemptions=sum(m.preemptions for m in snaps),
        recomputed_tokens=None if None in recomputed else sum(r for r in recomputed if r is not None),
        kv_usage=sum(kv) / len(kv) if kv else 0.0,
        waiting=sum(m.waiting for m in snaps),
    )
