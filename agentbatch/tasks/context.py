"""The batch context: what every step of a batch needs (store, engines, coordinator, writer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter
from agentbatch.protocols.engine import Engine
from agentbatch.protocols.environment import EnvironmentFactory
from agentbatch.scheduling.types import StepTicket
from agentbatch.tasks.coordinator import Coordinator

if TYPE_CHECKING:
    from agentbatch.tasks.steps import RetryPolicy


@dataclass(eq=False)
class BatchContext:
    """What every step of a batch needs. A plain class on purpose: Prefect does not traverse it."""

    store: Store
    batch_id: int
    workload: EnvironmentFactory
    engines: dict[str, Engine]
    coordinator: Coordinator
    retry: RetryPolicy
    max_steps: int
    step_timeout_s: float
    clock: Callable[[], float] = time.time  # wall clock: ticket times are stored as they are
    on_step: Callable[[StepTicket], None] | None = None  # progress hook
    writer: StepWriter = None  # type: ignore[assignment]  # started on the store when not given
    on_commit: Callable[[dict[str, Any]], None] | None = None  # sees each completed step's row (Prefect events)

    def __post_init__(self) -> None:
        if self.writer is None:
            self.writer = StepWriter(self.store).start()
