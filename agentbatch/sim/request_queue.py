"""The engine's waiting queue, one class per scheduling policy (after vLLM v1's request_queue.py).

"fcfs": arrival order; a preempted request goes back to the front. "priority": the smallest
(priority, arrival, admission number) first, the order vLLM's `--scheduling-policy priority` uses.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque

from agentbatch.sim.requests import EngineRequest

POLICIES = ("fcfs", "priority")


class RequestQueue(ABC):
    @abstractmethod
    def push(self, r: EngineRequest, front: bool = False) -> None:
        """Queue `r`; `front` for a preempted request (FCFS puts it first)."""

    @abstractmethod
    def peek(self) -> EngineRequest | None: ...

    @abstractmethod
    def pop(self) -> None:
        """Drop the request `peek` returned."""

    @abstractmethod
    def remove(self, r: EngineRequest) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...


class FCFSQueue(RequestQueue):
    def __init__(self) -> None:
        self._q: deque[EngineRequest] = deque()

    def push(self, r: EngineRequest, front: bool = False) -> None:
        if front:
            self._q.appendleft(r)
        else:
            self._q.append(r)

    def peek(self) -> EngineRequest | None:
        return self._q[0] if self._q else None

    def pop(self) -> None:
        self._q.popleft()

    def remove(self, r: EngineRequest) -> None:
        self._q.remove(r)

    def __len__(self) -> int:
        return len(self._q)


class PriorityQueue(RequestQueue):
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, EngineRequest]] = []

    def push(self, r: EngineRequest, front: bool = False) -> None:
        heapq.heappush(self._heap, (r.priority, r.arrival, r.seq, r))

    def peek(self) -> EngineRequest | None:
        return self._heap[0][3] if self._heap else None

    def pop(self) -> None:
        heapq.heappop(self._heap)

    def remove(self, r: EngineRequest) -> None:
        self._heap = [e for e in self._heap if e[3] is not r]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


def create_request_queue(policy: str) -> RequestQueue:
    if policy == "priority":
        return PriorityQueue()
    if policy == "fcfs":
        return FCFSQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; expected 'fcfs' or 'priority'")
