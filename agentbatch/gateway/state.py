"""What both gateways share: their settings, counters and state, and taking a step's slot from the coordinator.

A step (an inference request or a tool call) takes the next step index of its sample, waits for its
slot (a worker slot chosen by the router, or an environment slot in CAAS order), runs, and gives
the slot back; the sample's progress (steps done, time attained) advances when it completed, which
is what CAAS and the chain-progress priority read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.step_records import StepAttempt, StepOutcome
from agentbatch.db.writer import StepWriter
from agentbatch.gateway.forward import WorkerPool
from agentbatch.gateway.samples import GatewaySample, SampleRegistry
from agentbatch.protocols.retry import RetryPolicy
from agentbatch.scheduling.types import StepKind, StepTicket
from agentbatch.tasks.coordinator import Coordinator


@dataclass
class GatewaySettings:
    idle_timeout_s: float = 300.0  # an admitted sample without a step for this long ends
    end_on_answer: bool = True  # an answer without tool calls ends the sample
    # While samples wait for admission, one with no step in flight for yield_factor times its longest
    # step gap (at least yield_min_s) gives its slot to them; its next step takes one again, first.
    yield_min_s: float = 1.0
    yield_factor: float = 4.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # inference requests and tool calls
    request_timeout_s: float = 600.0  # per request to a worker
    call_timeout_s: float = 600.0  # per tool call to an upstream MCP server
    metrics_interval_s: float = 2.0  # how often workers' /metrics are scraped (0: never)
    bind_host: str = "127.0.0.1"  # with localhost, the hosts a request's Host header may name ...
    allowed_hosts: tuple[str, ...] = ()  # ... and these ("*": any)
    max_body_bytes: int = 32 * 2**20  # larger request bodies are refused before they are read
    body_timeout_s: float = 60.0  # a request body that stalls this long is refused
    header_timeout_s: float = 30.0  # a connection without a whole request head this long is closed
    keep_alive_s: int = 75  # an idle keep-alive connection is closed after this long
    per_sample_upstreams: tuple[str, ...] = ()  # upstream MCP servers with one session per sample


@dataclass
class GatewayCounters:
    requests: int = 0  # inference requests answered (any status)
    streamed: int = 0
    failed: int = 0  # inference requests that ended in an error
    tool_calls: int = 0
    tool_failures: int = 0  # upstream failures (not tool errors the upstream reported)
    cancelled: int = 0  # steps cut off (client gone, shutdown)
    waiting: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in StepKind})


@dataclass(eq=False)
class GatewayState:
    """What the request handlers of both gateways work with."""

    batch_id: int
    coordinator: Coordinator
    registry: SampleRegistry
    recorder: StepWriter  # the process's one step writer (posted writes: requests never wait on the store)
    pool: WorkerPool
    settings: GatewaySettings
    counters: GatewayCounters = field(default_factory=GatewayCounters)
    clock: Callable[[], float] = time.time
    held: set[HeldSlot] = field(default_factory=set)  # steps holding a slot now
    policy: dict[str, Any] = field(default_factory=dict)  # which policy runs (GET /v1/batch)


@dataclass(eq=False)
class HeldSlot:
    """A step holding its slot, and its current attempt (each attempt is one `steps` row)."""

    sample: GatewaySample
    ticket: StepTicket
    slot: str
    started_at: float = 0.0
    attempt: StepAttempt | None = None
    released: bool = False

    @property
    def kind(self) -> str:
        return self.ticket.kind.value

    def begin(self, state: GatewayState, request: dict[str, Any] | None) -> None:
        """The next attempt starts now."""
        self.started_at = state.clock()
        worker = self.ticket.worker if self.ticket.kind == StepKind.INFERENCE else self.slot
        self.attempt = StepAttempt(
            batch_id=state.batch_id, sample=self.sample.row, index=self.ticket.step_index,
            attempt=self.attempt.attempt + 1 if self.attempt else 1, kind=self.kind,
            enqueued_at=self.ticket.enqueued_at, started_at=self.started_at, worker=worker, request=request)
        state.recorder.record(self.attempt.begun())

    def complete(self, state: GatewayState, outcome: StepOutcome) -> None:
        """Stamped before the slot is given back: recorded intervals never overlap more than the slots.
        The sample's progress is this step's (the coordinator counts it when the slot comes back)."""
        assert self.attempt is not None
        state.recorder.record(self.attempt.completed(outcome, steps_done=self.sample.progress.steps_done + 1,
                                                     finished_at=state.clock()))

    def fail(self, state: GatewayState, error: str) -> None:
        assert self.attempt is not None
        state.recorder.record(self.attempt.failed(error, state.clock()))


async def acquire_step(state: GatewayState, sample: GatewaySample, kind: StepKind) -> HeldSlot:
    ticket = StepTicket(sample=sample.progress, kind=kind, step_index=sample.take_index(),
                        enqueued_at=state.clock())
    state.counters.waiting[kind.value] += 1
    try:
        slot = await state.coordinator.acquire(ticket)
    finally:
        state.counters.waiting[kind.value] -= 1
    held = HeldSlot(sample=sample, ticket=ticket, slot=slot, started_at=state.clock())
    state.held.add(held)
    return held


def release_step(state: GatewayState, held: HeldSlot, *, completed: bool) -> bool:
    """Give the step's slot back; only the first call does (False after): every error path may
    call it without giving a slot back twice."""
    if held.released:
        return False
    held.released = True
    state.held.discard(held)
    # The coordinator advances the sample's progress (steps done, attained service) itself.
    state.coordinator.release(held.ticket, held.slot, completed=completed)
    return True


def abandon_step(state: GatewayState, held: HeldSlot, error: str, *, cancelled: bool = False) -> bool:
    """End a step that did not run to its end (an unexpected error, a cancel, the shutdown): a failed
    step row (written now if the attempt had not begun), its slot and its hold on the sample given
    back. False when the step had already ended."""
    if held.released:
        return False
    if held.attempt is None:
        held.begin(state, None)
    held.fail(state, error)
    release_step(state, held, completed=False)
    state.counters.cancelled += cancelled
    if held.ticket.kind == StepKind.INFERENCE:
        state.registry.leave_request(held.sample, completed=False)
        state.counters.requests += 1
        state.counters.failed += 1
    else:
        state.registry.leave(held.sample)
        state.counters.tool_calls += 1
    return True
