"""Per-step visibility in Prefect without a task run per step: step summaries as batched events.

A Prefect task run costs the server ~40 ms of CPU (one server records ~20-25 a second) and the client
a round of state changes on the step's critical path. An event costs the server ~4 ms and is sent by
Prefect's events worker thread, off the event loop. `StepEvents` goes one step further: it collects
the summaries of committed steps and, every `interval_s`, emits one `agentbatch.steps.completed`
event per `steps_per_event` steps (grouped by sample), each naming the samples' chain task runs and
the flow run as related resources. At 1,000 steps/s that is ~5 events a second: far below what one
server records, so the batch never waits on Prefect, and every step is still listed in Prefect's
event feed (filter by the flow run or by a sample's task run).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any

from prefect.context import FlowRunContext, TaskRunContext
from prefect.events import emit_event

log = logging.getLogger(__name__)

EVENT = "agentbatch.steps.completed"
_SUMMARY = ("index", "kind", "attempt", "worker", "started_at", "finished_at", "prompt_tokens",
            "cached_prompt_tokens", "output_tokens", "tool_calls")


def step_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What an event says of one step: ids, timings, tokens; not the conversation."""
    out = {k: row[k] for k in _SUMMARY if row.get(k) is not None}
    out["sample_id"] = row["sample_id"]
    return out


@dataclass
class EmitterStats:
    steps: int = 0
    events: int = 0


@dataclass(eq=False)
class StepEvents:
    """Batches step summaries into Prefect events; one per batch run, on the flow's event loop. The
    flow hands `record` to the batch context as its `on_commit` hook."""

    batch_id: int
    interval_s: float = 2.0
    steps_per_event: int = 200
    max_related: int = 90  # under Prefect's default maximum of related resources per event (100)
    stats: EmitterStats = field(default_factory=EmitterStats)
    _pending: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    _timer: asyncio.Task[None] | None = None
    _flow_run: str | None = None
    _context: contextvars.Context | None = None

    def record(self, row: dict[str, Any]) -> None:
        """A committed step (its store row); cheap: appended, emitted at the next flush."""
        self._pending.append((step_summary(row), row.get("task_run_id")))

    # --- lifetime: owned by the flow that runs the batch: started before its chains, closed after ---------
    def start(self) -> None:
        """Start the periodic flush on the running loop (inside the flow run)."""
        if self._timer is not None:
            return
        ctx = FlowRunContext.get()
        self._flow_run = str(ctx.flow_run.id) if ctx and ctx.flow_run else None
        # Emit from the flow's context without any task run: Prefect's events worker would otherwise
        # relate every event to that task run.
        self._context = contextvars.copy_context()
        self._context.run(TaskRunContext.__var__.set, None)  # type: ignore[arg-type]  # deliberately no task run
        self._timer = asyncio.get_running_loop().create_task(self._tick(), name="agentbatch-step-events",
                                                             context=self._context)

    def close(self) -> None:
        """Stop the periodic flush and emit what is left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        (self._context or contextvars.copy_context()).run(self.flush)

    async def _tick(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.interval_s)
                self.flush()

    # --- emission ---------------------------------------------------------------------------------------
    def flush(self) -> None:
        pending, self._pending = self._pending, []
        pending.sort(key=lambda p: (p[0]["sample_id"], p[0].get("index", 0)))
        for i in range(0, len(pending), self.steps_per_event):
            self._emit(pending[i : i + self.steps_per_event])

    def _related(self, chunk: list[tuple[dict[str, Any], str | None]]) -> list[dict[str, str]]:
        related = []
        if self._flow_run:
            related.append({"prefect.resource.id": f"prefect.flow-run.{self._flow_run}",
                            "prefect.resource.role": "flow-run"})
        task_runs = dict.fromkeys(t for _, t in chunk if t)
        related += [{"prefect.resource.id": f"prefect.task-run.{t}", "prefect.resource.role": "task-run"}
                    for t in list(task_runs)[: self.max_related - len(related)]]
        return related

    def _emit(self, chunk: list[tuple[dict[str, Any], str | None]]) -> None:
        steps = [s for s, _ in chunk]
        samples = sorted({s["sample_id"] for s in steps})
        try:
            emit_event(
                EVENT,
                resource={"prefect.resource.id": f"agentbatch.batch.{self.batch_id}",
                          "prefect.resource.name": f"batch {self.batch_id}"},
                related=self._related(chunk),
                payload={"batch_id": self.batch_id, "samples": samples, "steps": steps},
            )
        except Exception as exc:  # noqa: BLE001 - visibility must never fail the batch
            log.warning("batch %s: could not emit step events: %s", self.batch_id, exc)
            return
        self.stats.events += 1
        self.stats.steps += len(steps)
