"""CAAS: Chain-Advancing Action Scheduling, for the environment-action queue (and optionally the
inference queues).

The waiting action of the sample with the most observed progress runs first, so long chains keep
moving and the batch tail shrinks (longest-remaining-chain-first is makespan-optimal in the classic
cases, Hu; Muntz-Coffman; least-attained-service points the other way and is for mean latency).
A sample has at most one waiting step, and its progress does not change while it waits, so the key
is fixed at push time and a binary heap suffices: push and pop are O(log n).

Starvation guard: a ticket that has waited longer than `max_wait_s` (in the queue's clock) is
served before any ordered one, oldest first.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from agentbatch.scheduling.policies import QueuePolicy
from agentbatch.scheduling.types import StepTicket


class CaasQueue(QueuePolicy):
    """Order by observed progress: steps done (more first), then attained time (more first), then
    arrival (admission order). `max_wait_s=None` disables the starvation guard."""

    def __init__(self, max_wait_s: float | None = 600.0) -> None:
        super().__init__()
        if max_wait_s is not None and max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0 or None")
        self.max_wait_s = max_wait_s
        self._heap: list[tuple[Any, ...]] = []  # (*key, seq, ticket): flat, so comparisons stay shallow
        self._fifo: deque[StepTicket] = deque()  # push order, for the aging guard
        self._gone: set[int] = set()  # seqs popped by the other structure (or removed)
        self._n = 0
        self.aged_pops = 0  # how often the starvation guard fired

    def key(self, ticket: StepTicket) -> tuple[float | int, ...]:
        s = ticket.sample
        return (-s.steps_done, -s.attained_s, s.arrival_seq)

    def _push(self, ticket: StepTicket) -> None:
        heapq.heappush(self._heap, (*self.key(ticket), ticket.seq, ticket))
        if self.max_wait_s is not None:
            self._fifo.append(ticket)
        self._n += 1

    def _drop_gone_fifo(self) -> None:
        fifo, gone = self._fifo, self._gone
        while fifo and fifo[0].seq in gone:
            gone.discard(fifo.popleft().seq)

    def pop(self, now: float) -> StepTicket:
        if self._n == 0:
            raise IndexError("pop from an empty queue")
        self._n -= 1
        if self.max_wait_s is not None:
            self._drop_gone_fifo()
            oldest = self._fifo[0]
            if now - oldest.enqueued_at > self.max_wait_s:
                self._fifo.popleft()
                self._gone.add(oldest.seq)  # its heap entry is skipped later
                self.aged_pops += 1
                return oldest
        heap, gone = self._heap, self._gone
        while True:
            entry = heapq.heappop(heap)
            seq: int = entry[-2]
            ticket: StepTicket = entry[-1]
            if seq in gone:
                gone.discard(seq)
                continue
            if self.max_wait_s is not None:
                gone.add(seq)  # its fifo entry is skipped later
            return ticket

    def __len__(self) -> int:
        return self._n

    def remove(self, ticket: StepTicket) -> bool:
        # Tickets are marked gone once per structure that still holds them.
        if ticket.seq in self._gone or not any(e[-1] is ticket for e in self._heap):
            return False
        self._gone.add(ticket.seq)
        if self.max_wait_s is not None:
            self._fifo.remove(ticket)
        self._n -= 1
        return True


class CaasHistoryQueue(CaasQueue):
    """History-aware CAAS: rank by the chain length the same task had in earlier batches.

    `SampleProgress.prior_chain_steps` is the prior (mean recorded steps of the task id).
    rank="total" (default): longest expected chain first, a static key, like LPT scheduling: the
      ranking does not change as samples advance, so the same samples keep moving and keep their
      prefix caches warm, while the longest chains, which set the makespan, go first.
    rank="remaining": longest expected remaining chain first (prior - steps done, floored at 0), the
      textbook longest-remaining-first. It rotates service between samples as each one advances
      (the leader drops below the others), which on a KV-limited engine evicts and recomputes the
      waiting samples' prefixes; bench/ablation.py shows the cost.
    rank="progress": observed progress first, as plain CAAS (steps done, more first), the expected
      chain length breaking its ties (before attained time). The prior can then only reorder samples
      CAAS holds equal, so it never rotates service away from the leaders (whose prefixes are warm):
      the ordering that does not lose to plain CAAS once environment slots stop being scarce.
    Samples without a prior come after those with one (`unknown_last=True`) or before them, ordered
    among themselves by observed progress like plain CAAS; ties fall back to observed progress, then
    arrival.
    """

    def __init__(self, max_wait_s: float | None = 600.0, unknown_last: bool = True, rank: str = "total") -> None:
        super().__init__(max_wait_s=max_wait_s)
        if rank not in ("total", "remaining", "progress"):
            raise ValueError(f"rank must be 'total', 'remaining' or 'progress', got {rank!r}")
        self.unknown_last = unknown_last
        self.rank = rank

    def key(self, ticket: StepTicket) -> tuple[float | int, ...]:
        s = ticket.sample
        if s.prior_chain_steps is None:
            return (1 if self.unknown_last else -1, 0.0, -s.steps_done, -s.attained_s, s.arrival_seq)
        expected = s.prior_chain_steps
        if self.rank == "progress":
            return (0, -s.steps_done, -expected, -s.attained_s, s.arrival_seq)
        if self.rank == "remaining":
            expected = max(0.0, expected - s.steps_done)
        return (0, -expected, -s.steps_done, -s.attained_s, s.arrival_seq)
