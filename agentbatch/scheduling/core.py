"""The scheduling core: ONE state machine that both clocks drive.

It holds every scheduling decision of a batch: which samples are admitted (up to a limit that may
change while the batch runs), which waiting step gets a free slot of an engine worker or of the
environment pool (asked of the queue policies), which worker serves an inference call (the router,
told through its hooks where each sample's prefix lives), coupled mode, and each sample's progress
(steps done, attained service) that CAAS and the priorities read.

It does no I/O and never waits: a driver tells it what happened (`submit`, `complete`, `release`,
`finish`, `set_admission_limit`) with the driver's clock, and every call returns the `Grant`s it
made, in order. The live driver (`tasks/coordinator.py`) resolves asyncio futures with them; the
virtual-time driver (`sim/virtual_time/`) starts simulated work. Both run the same decisions, so a
virtual replay predicts what the live runner does (tests/replay/test_replay_parity.py).

Coupled mode (the baseline, like inspect_ai's `max_sandboxes`): a sample takes an environment slot
when admitted and keeps it to its end; its environment steps then need no further slot.

Attained service (one definition, both clocks): the sum over a sample's completed steps of the time
from the step's grant to its completion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from agentbatch.scheduling.admission_control import AdmissionController, AdmissionSignals, EngineMeasurements
from agentbatch.scheduling.policies import AdmissionLimits, FifoQueue, PriorityPolicy, QueuePolicy, Router
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad

ADMISSION = "admission"
ENVIRONMENT = "environment"
ADMISSION_STEP = -1  # step_index of an admission ticket

LoadHook = Callable[[list[WorkerLoad]], list[WorkerLoad]]
CountersHook = Callable[[], EngineMeasurements]


@dataclass(frozen=True, slots=True)
class Grant:
    """A slot given to a waiting ticket. `resource` is "admission", "environment" or a worker name."""

    ticket: StepTicket
    resource: str
    slot: str


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """One line of the grant log (`SchedulingCore(record=True)`): what the parity test compares."""

    resource: str
    sample_id: int
    step_index: int
    at: float


@dataclass(frozen=True)
class PolicySwap:
    """What `SchedulingCore.swap` changes (None: keep). `admission_order` reorders the samples still
    waiting for admission; `controller` is a 1-tuple: (None,) turns adaptive admission off."""

    coupled: bool | None = None
    admission_limit: int | None = None
    env_queue: QueuePolicy | None = None
    inference_queues: Mapping[str, QueuePolicy] | None = None
    router: Router | None = None
    priority: PriorityPolicy | None = None
    admission_order: Callable[[list[SampleProgress]], list[SampleProgress]] | None = None
    controller: tuple[AdmissionController | None] | None = None


def _moved(old: QueuePolicy, new: QueuePolicy) -> QueuePolicy:
    """`new` with `old`'s waiting tickets, pushed in the order `old` would have served them (popped
    at -inf, so no aging guard fires). All are popped before any is pushed: a push gives the ticket
    a new `seq`, and a queue that skips served tickets lazily by their `seq` (CaasQueue) must not see
    one change while it still holds it."""
    waiting = [old.pop(-math.inf) for _ in range(len(old))]
    for ticket in waiting:
        new.push(ticket)
    return new


@dataclass(slots=True)
class PoolStats:
    peak_in_use: int = 0
    granted: int = 0


class SlotPool:
    """Named slots of one resource and the queue of tickets waiting for them.

    The capacity may shrink while slots are held: the surplus is dropped as its holders give back.
    """

    def __init__(self, name: str, prefix: str, capacity: int, queue: QueuePolicy) -> None:
        self.name = name
        self.prefix = prefix
        self.queue = queue
        self.capacity = 0
        self.in_use = 0
        self.free: list[str] = []  # a stack: the lowest-numbered free slot is taken first
        self._made = 0
        self.stats = PoolStats()
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        while self.in_use + len(self.free) < capacity:
            self.free.insert(0, f"{self.prefix}{self._made}")
            self._made += 1
        while self.free and self.in_use + len(self.free) > capacity:
            self.free.pop(0)

    def take(self) -> str:
        slot = self.free.pop()
        self.in_use += 1
        self.stats.granted += 1
        self.stats.peak_in_use = max(self.stats.peak_in_use, self.in_use)
        return slot

    def give(self, slot: str) -> None:
        self.in_use -= 1
        if self.in_use + len(self.free) < self.capacity:
            self.free.append(slot)


class SchedulingCore:
    """The pure scheduling state machine of one batch (see the module docstring)."""

    def __init__(
        self,
        limits: AdmissionLimits,
        workers: Sequence[str],
        env_queue: QueuePolicy,
        inference_queues: Mapping[str, QueuePolicy],
        router: Router,
        priority: PriorityPolicy,
        *,
        load_hook: LoadHook | None = None,
        record: bool = False,
    ) -> None:
        if not workers:
            raise ValueError("the scheduling core needs at least one engine worker")
        self.limits = limits
        self.router = router
        self.priority = priority
        # Adds what the core cannot see (real KV usage and queue lengths from the workers' /metrics,
        # or the engine model's KV usage) to the router's view of the workers.
        self.load_hook = load_hook
        self.admission_limit = limits.max_active_samples
        self.admission_stopped = False  # stop_admission: nothing is admitted any more
        self._admission_queue = FifoQueue()
        self.admission = SlotPool(ADMISSION, "active-", limits.effective_active(), self._admission_queue)
        self.environment = SlotPool(ENVIRONMENT, "env-", limits.env_slots, env_queue)
        self.workers = {w: SlotPool(w, f"{w}#", limits.per_worker_inflight, inference_queues[w]) for w in workers}
        self._admitted: dict[int, str] = {}  # sample id -> its admission slot
        self._held_env: dict[int, str] = {}  # coupled mode: sample id -> its environment slot
        self._held_busy: set[int] = set()  # coupled mode: samples whose held slot runs an action now
        self._cached: dict[str, set[int]] = {w: set() for w in workers}  # samples whose prefix a worker holds
        self._admissions = 0  # admission grants so far: each sample's arrival_seq
        self.sticky = 0  # inference calls routed back to the sample's previous worker
        self.moves = 0  # inference calls routed away from it
        self.log: list[GrantRecord] | None = [] if record else None
        self.controller: AdmissionController | None = None  # adaptive admission (enable_adaptive_admission)
        self.engine_counters: CountersHook | None = None
        self.steps_completed = 0
        self.samples_finished = 0

    # --- what drivers tell the core -----------------------------------------------------------------
    def admission_ticket(self, sample: SampleProgress, now: float) -> StepTicket:
        return StepTicket(sample=sample, kind=StepKind.INFERENCE, step_index=ADMISSION_STEP, enqueued_at=now)

    def submit(self, ticket: StepTicket, now: float, *, first: bool = False) -> list[Grant]:
        """A ticket starts waiting: an admission ticket, an environment action or an inference call
        (routed here; the chosen worker is left in `ticket.worker`). `first`: an admission ticket
        goes ahead of the waiting ones (a sample that yielded its slot asks again)."""
        if first and ticket.step_index == ADMISSION_STEP:
            self._admission_queue.push_first(ticket)
            return self._pump(self.admission, now)
        held = self._held_env.get(ticket.sample.sample_id)
        if ticket.kind == StepKind.ENVIRONMENT and held is not None:  # coupled: its own slot
            self._held_busy.add(ticket.sample.sample_id)
            return [self._record(Grant(ticket, ENVIRONMENT, held), now)]
        pool = self._pool_for(ticket, route=True)
        pool.queue.push(ticket)
        return self._pump(pool, now)

    def complete(self, ticket: StepTicket, slot: str, now: float) -> list[Grant]:
        """The step ended: the sample has progressed and the slot is free again."""
        sample = ticket.sample
        sample.steps_done += 1
        if ticket.granted_at is not None:
            sample.attained_s += now - ticket.granted_at
        if ticket.kind == StepKind.INFERENCE and ticket.worker is not None:
            self._learn(sample, ticket.worker)
        self.steps_completed += 1
        grants = self.release(ticket, slot, now)
        if self.controller is not None and self.controller.due(self.steps_completed):
            grants += self._adapt(now)
        return grants

    def release(self, ticket: StepTicket, slot: str, now: float) -> list[Grant]:
        """Give a step's slot back without progress (the step failed or was cancelled)."""
        if ticket.step_index == ADMISSION_STEP:  # an admission whose waiter went away
            return self.finish(ticket.sample, now)
        if slot == self._held_env.get(ticket.sample.sample_id):
            self._held_busy.discard(ticket.sample.sample_id)
            return []
        pool = self._pool_for(ticket, route=False)
        pool.give(slot)
        return self._pump(pool, now)

    def withdraw(self, ticket: StepTicket) -> bool:
        """A waiting ticket stops waiting (its waiter was cancelled); False if it was not waiting."""
        return self._pool_for(ticket, route=False).queue.remove(ticket)

    def finish(self, sample: SampleProgress, now: float) -> list[Grant]:
        """The sample ended: its admission slot (and, coupled, its environment slot) is free; a
        sample that had yielded its slot holds none."""
        sid = sample.sample_id
        self.samples_finished += 1
        self._give_admission(sid)
        for cached in self._cached.values():
            cached.discard(sid)
        self.router.on_sample_finished(sid)
        return self._pump(self.admission, now)

    def yield_admission(self, sample: SampleProgress, now: float) -> list[Grant]:
        """An admitted sample with no step in flight gives its admission slot to a waiting sample
        without ending: the workers keep its prefix, and it asks again (`submit(..., first=True)`)
        with its next step."""
        self._give_admission(sample.sample_id)
        return self._pump(self.admission, now)

    def _give_admission(self, sid: int) -> None:
        slot = self._admitted.pop(sid, None)
        if slot is not None:
            self.admission.give(slot)
        held = self._held_env.pop(sid, None)
        self._held_busy.discard(sid)
        if held is not None:
            self.environment.give(held)

    def set_admission_limit(self, limit: int, now: float) -> list[Grant]:
        """Change how many samples may be admitted at once (an admission controller's knob). A lower
        limit takes effect as admitted samples finish; nothing running is stopped."""
        if limit < 1:
            raise ValueError(f"admission limit must be >= 1, got {limit}")
        self.admission_limit = limit
        self.admission.resize(self.limits.effective_active(limit))
        return self._pump(self.admission, now)

    def stop_admission(self) -> None:
        """Admit no sample from now on (the batch is stopping: --fail-on-error); no later limit or
        capacity change, an admission controller's included, opens admission again. Admitted samples
        run on."""
        self.admission_stopped = True

    def set_env_slots(self, slots: int, now: float) -> list[Grant]:
        """Change how many environment actions may run at once (e.g. this process's share of a limit
        that several processes split). A lower number takes effect as running actions end."""
        if slots < 1:
            raise ValueError(f"environment slots must be >= 1, got {slots}")
        self.environment.resize(slots)
        return self._pump(self.environment, now)

    def set_capacities(self, capacities: Mapping[str, int], now: float) -> list[Grant]:
        """Resize pools by name (`admission`, `environment`, a worker's name); 0 is allowed: a process's
        share of a limit that several processes split may be none for now. A lower capacity takes effect
        as held slots come back; waiting tickets are granted when it grows."""
        grants: list[Grant] = []
        for pool in self.pools():
            if pool.name in capacities:
                if capacities[pool.name] < 0:
                    raise ValueError(f"{pool.name}: capacity must be >= 0, got {capacities[pool.name]}")
                pool.resize(capacities[pool.name])
                grants += self._pump(pool, now)
        return grants

    def swap(self, swap: PolicySwap, now: float) -> list[Grant]:
        """Run the rest of the batch with other policies (re-planning while it runs); only what
        `swap` sets changes. Safe at any instant between two driver calls: nothing granted is taken
        back, no waiting ticket is lost (each queue's waiters move to its successor, in the order the
        old one would have served them), and a lower admission limit takes effect as admitted samples
        finish. Leaving coupled mode turns each held environment slot into an ordinary one (given back
        at once if idle, else when its action ends). Entering coupled mode is refused: with samples
        admitted beyond the slots no sample could be given a slot to hold; run the coupled
        configuration as its decoupled equivalent instead (admission limit min(limit, slots): every
        admitted sample then finds a free slot for each action, as if it held one)."""
        if swap.coupled and not self.limits.coupled:
            raise ValueError("cannot enter coupled mode while the batch runs; swap to its decoupled equivalent")
        if swap.coupled is False and self.limits.coupled:
            self._uncouple()
        if swap.env_queue is not None:
            self.environment.queue = _moved(self.environment.queue, swap.env_queue)
        for w, queue in (swap.inference_queues or {}).items():
            self.workers[w].queue = _moved(self.workers[w].queue, queue)
        if swap.router is not None:
            self._prime(swap.router)
        if swap.priority is not None:
            self.priority = swap.priority
        if swap.admission_order is not None:
            self._reorder_admission(swap.admission_order)
        if swap.controller is not None:
            self.controller = swap.controller[0]
        grants = self._pump(self.environment, now)
        if swap.admission_limit is not None:
            grants += self.set_admission_limit(swap.admission_limit, now)
        return grants + self._pump(self.admission, now)

    def _uncouple(self) -> None:
        self.limits = replace(self.limits, coupled=False)
        for sid in sorted(self._held_env):
            slot = self._held_env.pop(sid)
            if sid not in self._held_busy:  # idle: back to the pool; a busy one returns through release()
                self.environment.give(slot)
        self._held_busy.clear()
        self.admission.resize(self.limits.effective_active(self.admission_limit))

    def _prime(self, router: Router) -> None:
        # A new router learns where each admitted sample's prefix lives, as the old one had.
        for w, cached in self._cached.items():
            for sid in sorted(cached):
                router.on_request_complete(sid, w)
        self.router = router

    def _reorder_admission(self, order: Callable[[list[SampleProgress]], list[SampleProgress]]) -> None:
        queue = self._admission_queue
        waiting = [queue.pop(-math.inf) for _ in range(len(queue))]
        by_sample = {id(t.sample): t for t in waiting}
        for sample in order([t.sample for t in waiting]):
            queue.push(by_sample.pop(id(sample)))
        for t in waiting:  # any the order left out keep their place after the others
            if id(t.sample) in by_sample:
                queue.push(by_sample.pop(id(t.sample)))

    def enable_adaptive_admission(self, controller: AdmissionController, counters: CountersHook | None) -> None:
        """Let `controller` set the admission limit after each window of completed steps, from the
        core's queues and the engines' counters (`counters`: the engine model's metrics in virtual
        time, the workers' /metrics live). Both drivers call this with the same controller."""
        self.controller = controller
        self.engine_counters = counters

    def admission_signals(self) -> AdmissionSignals:
        return AdmissionSignals(
            admitted=self.admission.in_use, waiting_admission=len(self.admission.queue),
            env_queued=len(self.environment.queue), env_slots=self.environment.capacity,
            inference_queued=sum(len(p.queue) for p in self.workers.values()), steps_completed=self.steps_completed,
            samples_finished=self.samples_finished,
            engine=self.engine_counters() if self.engine_counters is not None else EngineMeasurements(measured=False),
        )  # fmt: skip

    # --- what drivers ask ---------------------------------------------------------------------------
    def request_priority(self, sample: SampleProgress) -> int | None:
        return self.priority.priority(sample)

    def is_admitted(self, sample_id: int) -> bool:
        """Whether the sample holds an admission slot now."""
        return sample_id in self._admitted

    def worker_loads(self) -> list[WorkerLoad]:
        loads = [
            WorkerLoad(name=w, in_flight=p.in_use, queued=len(p.queue), capacity=p.capacity,
                       cached_samples=self._cached[w])
            for w, p in self.workers.items()
        ]  # fmt: skip
        return self.load_hook(loads) if self.load_hook is not None else loads

    def pools(self) -> Iterable[SlotPool]:
        yield self.admission
        yield self.environment
        yield from self.workers.values()

    def peaks(self) -> dict[str, int]:
        return {p.name: p.stats.peak_in_use for p in self.pools()}

    def in_use(self) -> dict[str, int]:
        return {p.name: p.in_use for p in self.pools()}

    def queued(self) -> dict[str, int]:
        return {p.name: len(p.queue) for p in self.pools()}

    # --- inside -------------------------------------------------------------------------------------
    def _adapt(self, now: float) -> list[Grant]:
        assert self.controller is not None
        limit = self.controller.update(self.admission_signals())
        return self.set_admission_limit(limit, now) if limit != self.admission_limit else []

    def _pool_for(self, ticket: StepTicket, route: bool) -> SlotPool:
        if ticket.step_index == ADMISSION_STEP:
            return self.admission
        if ticket.kind == StepKind.ENVIRONMENT:
            return self.environment
        if route:
            ticket.worker = self._route(ticket)
        assert ticket.worker is not None, "an inference ticket is routed when submitted"
        return self.workers[ticket.worker]

    def _route(self, ticket: StepTicket) -> str:
        loads = self.worker_loads()
        self.router.update_loads(loads)
        worker = self.router.route(ticket, loads)
        previous = ticket.sample.last_worker
        if previous is not None:
            if previous == worker:
                self.sticky += 1
            else:
                self.moves += 1
        return worker

    def _learn(self, sample: SampleProgress, worker: str) -> None:
        # The worker that served the call now holds the sample's prefix; the others' copies go stale.
        sid = sample.sample_id
        for w, cached in self._cached.items():
            if w == worker:
                cached.add(sid)
            else:
                cached.discard(sid)
        sample.last_worker = worker
        self.router.on_request_complete(sid, worker)

    def _pump(self, pool: SlotPool, now: float) -> list[Grant]:
        grants: list[Grant] = []
        if pool is self.admission and self.admission_stopped:
            return grants
        while pool.free and len(pool.queue):
            ticket = pool.queue.pop(now)
            grants.append(self._record(Grant(ticket, pool.name, pool.take()), now))
            if pool is self.admission:
                self._admitted_now(ticket, grants[-1].slot)
        return grants

    def _admitted_now(self, ticket: StepTicket, slot: str) -> None:
        sample = ticket.sample
        sample.arrival_seq = self._admissions
        self._admissions += 1
        self._admitted[sample.sample_id] = slot
        if self.limits.coupled:  # admission slots never outnumber environment slots when coupled
            self._held_env[sample.sample_id] = self.environment.take()

    def _record(self, grant: Grant, now: float) -> Grant:
        grant.ticket.granted_at = now
        if self.log is not None:
            t = grant.ticket
            self.log.append(GrantRecord(grant.resource, t.sample.sample_id, t.step_index, now))
        return grant
