"""Plain data types shared by every scheduling policy.

Nothing here does I/O or knows about Prefect or the database: the same objects are used by the
live task runner and by the virtual-time simulation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class StepKind(enum.StrEnum):
    INFERENCE = "inference"
    ENVIRONMENT = "environment"


@dataclass(slots=True)
class SampleProgress:
    """What a policy may observe of a sample while it runs.

    `sample_id` is a key: unique among the samples one scheduling core sees, and stable while the
    sample runs. The core, the routers and the grant log use it only to tell samples apart, never
    as a position or a store row. Each driver picks its own: the live runner the sample's store row
    id, virtual time its trace index, the gateway its arrival number in this process (the row is
    written later).
    """

    sample_id: int
    task_id: str
    arrival_seq: int  # the order the core admitted it in (set at admission; breaks CAAS ties)
    steps_done: int = 0
    attained_s: float = 0.0  # service time received so far (inference + environment)
    prior_chain_steps: float | None = None  # expected total steps, from earlier batches
    last_worker: str | None = None  # worker that served this sample's previous inference


@dataclass(slots=True)
class StepTicket:
    """A step waiting for a resource (an engine worker slot or an environment slot)."""

    sample: SampleProgress
    kind: StepKind
    step_index: int
    enqueued_at: float  # clock of whoever queues it (wall or virtual seconds)
    seq: int = 0  # global enqueue order, set by the queue
    prompt_tokens: int = 0  # hint for routing / cost estimates
    worker: str | None = None  # chosen worker for inference steps
    granted_at: float | None = None  # when the scheduling core gave it a slot (driver's clock)
    payload: object = field(default=None, repr=False)  # opaque to policies


@dataclass(slots=True)
class WorkerLoad:
    """A router's view of one engine worker."""

    name: str
    in_flight: int = 0
    queued: int = 0
    capacity: int = 1  # max in-flight requests
    cached_samples: frozenset[int] | set[int] = frozenset()  # samples whose prefix it likely holds
    kv_usage: float | None = None  # 0..1 from /metrics where known

    @property
    def load(self) -> int:
        return self.in_flight + self.queued
