"""Policies by name, so a batch config can select them (`queue: fifo`, `router: round_robin`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentbatch.scheduling.caas import CaasHistoryQueue, CaasQueue
from agentbatch.scheduling.policies import (
    FcfsPriority,
    FifoQueue,
    PriorityPolicy,
    QueuePolicy,
    RoundRobinRouter,
    Router,
)
from agentbatch.scheduling.priority import ChainProgressPriority
from agentbatch.scheduling.routing import LeastLoadedRouter, TrajectoryAwareRouter

QUEUE_POLICIES: dict[str, Callable[..., QueuePolicy]] = {
    "fifo": FifoQueue,
    "caas": CaasQueue,
    "caas_history": CaasHistoryQueue,
}
ROUTERS: dict[str, Callable[..., Router]] = {
    "round_robin": RoundRobinRouter,
    "least_loaded": LeastLoadedRouter,
    "trajectory_aware": TrajectoryAwareRouter,
}
PRIORITIES: dict[str, Callable[..., PriorityPolicy]] = {
    "fcfs": FcfsPriority,
    "chain_progress": ChainProgressPriority,
}


def _make(table: dict[str, Callable[..., Any]], what: str, name: str, params: dict[str, Any]) -> Any:
    try:
        factory = table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(table)}") from None
    return factory(**params)


def make_queue(name: str, **params: Any) -> QueuePolicy:
    return _make(QUEUE_POLICIES, "queue policy", name, params)


def make_router(name: str, **params: Any) -> Router:
    return _make(ROUTERS, "router", name, params)


def make_priority(name: str, **params: Any) -> PriorityPolicy:
    return _make(PRIORITIES, "priority policy", name, params)
