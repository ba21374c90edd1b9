"""The batch context: what every step of one batch run needs.

The flow that runs the batch (`flows/batch.py`) builds it and owns what it holds: it starts the step
writer before the first step and closes it after the last, and closes the engines and the workload.
The context itself starts nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentbatch.db.models import SampleStatus
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter
from agentbatch.protocols.engine import Engine
from agentbatch.protocols.environment import EnvironmentFactory
from agentbatch.protocols.retry import RetryPolicy
from agentbatch.tasks.coordinator import Coordinator

StepHook = Callable[[dict[str, Any]], None]


@dataclass(eq=False)
class BatchContext:
    """A plain class on purpose: Prefect does not traverse it (tasks get it `quote`d)."""

    store: Store
    batch_id: int
    workload: EnvironmentFactory
    engines: dict[str, Engine]  # by worker name
    coordinator: Coordinator
    writer: StepWriter  # started and closed by the flow that builds the context
    retry: RetryPolicy
    max_steps: int
    step_timeout_s: float
    on_commit: StepHook | None = None  # sees each committed step's row (chains mode: Prefect step events)
    # Told each sample's end (its status written, its admission slot not yet freed): --fail-on-error
    on_sample_end: Callable[[int, SampleStatus], None] | None = None
    clock: Callable[[], float] = time.time  # wall clock: ticket times are stored as they are
