"""Policies by name, so a batch config can select them (`queue: fifo`, `router: round_robin`).

The built-in names below are also entry points of the group `agentbatch.policies` (pyproject.toml);
other policies come from installed packages' entry points or "package.module:Object" and are
resolved by the flows (`agentbatch.protocols.plugins`), which pass the class to `make_*`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentbatch.scheduling.admission_control import AdmissionController
from agentbatch.scheduling.caas import CaasHistoryQueue, CaasQueue
from agentbatch.scheduling.core import LoadHook, SchedulingCore
from agentbatch.scheduling.defaults import ADMISSION_CONTROLS, DEFAULTS
from agentbatch.scheduling.policies import (
    AdmissionLimits,
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


# Which base class a policy of each role must derive from (a plugin policy is checked against it).
ROLES: dict[str, type] = {"queue": QueuePolicy, "router": Router, "priority": PriorityPolicy}
TABLES: dict[str, dict[str, Callable[..., Any]]] = {"queue": QUEUE_POLICIES, "router": ROUTERS, "priority": PRIORITIES}
# name -> "module:Class" of every built-in policy (the plugin resolver's view of the tables above).
BUILTIN_POLICIES: dict[str, str] = {
    name: f"{factory.__module__}:{factory.__qualname__}" for table in TABLES.values() for name, factory in table.items()
}

Factory = str | Callable[..., Any]
P = TypeVar("P")  # a policy role: QueuePolicy, Router or PriorityPolicy


def _make(table: Mapping[str, Callable[..., P]], role: type[P], what: str, name: Factory, params: dict[str, Any]) -> P:
    if callable(name):  # a plugin class or factory, already resolved
        factory: Callable[..., Any] = name
    else:
        try:
            factory = table[name]
        except KeyError:
            raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(table)}") from None
    policy = factory(**params)
    if not isinstance(policy, role):  # a plugin factory that made something else
        raise TypeError(f"{what} {name!r} made a {type(policy).__name__}, not a {role.__name__}")
    return policy


def make_queue(name: Factory, **params: Any) -> QueuePolicy:
    return _make(QUEUE_POLICIES, QueuePolicy, "queue policy", name, params)


def make_router(name: Factory, **params: Any) -> Router:
    return _make(ROUTERS, Router, "router", name, params)


def make_priority(name: Factory, **params: Any) -> PriorityPolicy:
    return _make(PRIORITIES, PriorityPolicy, "priority policy", name, params)


@dataclass(frozen=True)
class PolicySpec:
    """A policy by registry name (or its class, resolved as a plugin) with its keyword arguments: what
    the live runner (from a batch config's `scheduling.<role>`) and virtual time build each policy from."""

    name: Factory
    params: dict[str, Any] = field(default_factory=dict)


def build_core(
    limits: AdmissionLimits,
    workers: Sequence[str],
    *,
    env_queue: PolicySpec,
    inference_queue: PolicySpec,
    router: PolicySpec,
    priority: PolicySpec,
    load_hook: LoadHook | None = None,
    record: bool = False,
    admission_control: str = DEFAULTS.admission_control,
) -> SchedulingCore:
    """The scheduling core of a batch with its policies made from their names: the one place the
    live runner and virtual time build it. "adaptive" admission control (not when coupled) gives it
    the admission controller, starting at `limits.max_active_samples`; the driver then sets
    `core.engine_counters` where it can measure the engines."""
    if admission_control not in ADMISSION_CONTROLS:
        raise ValueError(f"admission_control must be one of {ADMISSION_CONTROLS}, got {admission_control!r}")
    core = SchedulingCore(
        limits, list(workers),
        env_queue=make_queue(env_queue.name, **env_queue.params),
        inference_queues={w: make_queue(inference_queue.name, **inference_queue.params) for w in workers},
        router=make_router(router.name, **router.params),
        priority=make_priority(priority.name, **priority.params),
        load_hook=load_hook, record=record,
    )  # fmt: skip
    if admission_control == "adaptive" and not limits.coupled:
        core.enable_adaptive_admission(AdmissionController(limits.max_active_samples), None)
    return core
