"""Policy interfaces and the baseline policies (FIFO queues, round-robin routing).

A queue policy decides which waiting step gets the next free slot of a resource. A router decides
which engine worker serves a sample's next inference call. Admission limits are plain numbers
(`AdmissionLimits`); the coupled/decoupled distinction is a flag the executors honour.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from agentbatch.scheduling.defaults import DEFAULTS
from agentbatch.scheduling.types import SampleProgress, StepTicket, WorkerLoad


class QueuePolicy(ABC):
    """An ordered set of waiting tickets. `pop` returns the one that runs next.

    A subclass implements `_push`, `pop` and `__len__`; `remove` works from those three (override it
    where cancellations are frequent or the queue's order depends on more than its tickets).
    """

    aged_pops: int = 0  # pops forced by a starvation guard (policies with one count them)

    def __init__(self) -> None:
        self._seq = itertools.count()

    def push(self, ticket: StepTicket) -> None:
        ticket.seq = next(self._seq)
        self._push(ticket)

    @abstractmethod
    def _push(self, ticket: StepTicket) -> None: ...

    @abstractmethod
    def pop(self, now: float) -> StepTicket:
        """Remove and return the next ticket; `now` lets aging policies guard against starvation."""

    @abstractmethod
    def __len__(self) -> int: ...

    def remove(self, ticket: StepTicket) -> bool:
        """Drop a ticket that no longer waits (its waiter was cancelled); False if it was not waiting.

        Default, O(n) pops and pushes: pop every ticket (at `now=-inf`, so no aging guard fires) and
        push back all but this one in the order they came out, their `seq` kept. That keeps the
        order of a queue that orders by its tickets alone (key, then seq)."""
        popped = [self.pop(-math.inf) for _ in range(len(self))]
        for t in popped:
            if t is not ticket:
                self._push(t)
        return any(t is ticket for t in popped)


class FifoQueue(QueuePolicy):
    """First come, first served."""

    def __init__(self) -> None:
        super().__init__()
        self._items: deque[StepTicket] = deque()

    def _push(self, ticket: StepTicket) -> None:
        self._items.append(ticket)

    def push_first(self, ticket: StepTicket) -> None:
        """Queue `ticket` ahead of every waiting one."""
        ticket.seq = next(self._seq)
        self._items.appendleft(ticket)

    def pop(self, now: float) -> StepTicket:
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def remove(self, ticket: StepTicket) -> bool:
        try:
            self._items.remove(ticket)
            return True
        except ValueError:
            return False


class Router(ABC):
    """Chooses the engine worker for a sample's next inference call.

    The scheduling core calls the hooks (as SGLang's routing policies have `on_request_complete` /
    `update_loads`): a router that keeps its own bookkeeping learns from them, the others ignore them.
    """

    wants_kv_usage: bool = False  # True: the driver fills WorkerLoad.kv_usage (from /metrics or the model)

    @abstractmethod
    def route(self, ticket: StepTicket, workers: Sequence[WorkerLoad]) -> str: ...

    def update_loads(self, workers: Sequence[WorkerLoad]) -> None:
        """The current view of the workers, just before a routing decision."""
        return None  # default: nothing to learn

    def on_request_complete(self, sample_id: int, worker: str) -> None:
        """`worker` served the sample's last inference call: it now holds the sample's prefix."""
        return None  # default: nothing to learn

    def on_sample_finished(self, sample_id: int) -> None:
        """The sample ended: forget what is kept about it."""
        return None  # default: nothing to learn

    def decision_counts(self) -> dict[str, int]:
        """Decision counters for reports (empty when the router keeps none)."""
        return {}


class RoundRobinRouter(Router):
    def __init__(self) -> None:
        self._next = 0

    def route(self, ticket: StepTicket, workers: Sequence[WorkerLoad]) -> str:
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker.name


class PriorityPolicy(ABC):
    """The per-request engine priority (vLLM `priority`: lower runs first) of a sample's next call."""

    @abstractmethod
    def priority(self, sample: SampleProgress) -> int | None: ...


class FcfsPriority(PriorityPolicy):
    """No priority: the engine serves requests in arrival order."""

    def priority(self, sample: SampleProgress) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Capacity limits an executor enforces.

    max_active_samples: samples admitted at once (the reference concurrency).
    env_slots: environment actions running at once.
    per_worker_inflight: inference requests in flight per engine worker.
    coupled: baseline mode where an admitted sample holds an environment slot from admission to
      its end (inspect_ai's max_sandboxes); then max_active_samples is capped at env_slots.
    """

    max_active_samples: int = DEFAULTS.max_active_samples
    env_slots: int = DEFAULTS.env_slots
    per_worker_inflight: int = DEFAULTS.per_worker_inflight
    coupled: bool = DEFAULTS.coupled

    def effective_active(self, max_active: int | None = None) -> int:
        """Admission slots for `max_active` (default: this limit): capped at env_slots when coupled."""
        n = self.max_active_samples if max_active is None else max_active
        return min(n, self.env_slots) if self.coupled else n
