"""A step of an external-state environment cut short by a crash: what a resume may ask and say.

Such a step may have executed on the server without agentbatch recording it. A resume runs it again
only where that is safe (every call takes an idempotency key or is annotated read-only or idempotent);
otherwise it asks the environment, when the workload can answer (`reconciles`), or stops the sample
with the error `in_flight_error` writes.

The reconcile hook, optional: a workload whose `reconciles` is true makes environments with

    async def reconcile(self, assistant: Message) -> Reconciled

called on the sample's fresh environment after `reset` and `restore`, with the assistant turn whose
step was cut short. It answers:

- "ran": the step took effect. `result` is its result as the environment reports it, recorded as the
  step's completion (None: each call gets a tool message saying it took effect, its output not
  recorded); the environment's own state must then be as after the step. The step is not run again.
- "not_run": nothing of it took effect; the step runs again.
- "unknown": the sample stops as without a hook, the `detail` in its error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import IN_FLIGHT_STOPPED, EnvResult

ReconcileStatus = Literal["ran", "not_run", "unknown"]
RECONCILE_STATUSES: tuple[ReconcileStatus, ...] = ("ran", "not_run", "unknown")
RECONCILED = "reconciled"  # key of an external step's request: what the environment answered after a crash


@dataclass(slots=True)
class Reconciled:
    """What an environment says of a step cut short by a crash (`reconcile`)."""

    status: ReconcileStatus
    result: EnvResult | None = None  # "ran": the step's result (None: see `applied_result`)
    detail: str = ""  # why, in a word or a sentence (logged; in the sample's error when "unknown")

    def __post_init__(self) -> None:
        if self.status not in RECONCILE_STATUSES:
            raise ValueError(f"Reconciled.status: expected one of {RECONCILE_STATUSES}, got {self.status!r}")


def reconciles(workload: Any) -> bool:
    """Whether the workload's environments answer `reconcile` (the workload declares `reconciles`)."""
    return bool(getattr(workload, "reconciles", False))


def applied_result(assistant: Message) -> EnvResult:
    """A step that ran but whose output is lost: one tool message per call saying so."""
    calls = assistant.get("tool_calls") or []
    messages = [{"role": "tool", "tool_call_id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                 "content": "applied before agentbatch restarted; its output was not recorded"} for c in calls]
    return EnvResult(messages=messages, tool_calls=len(calls))


def in_flight_why(policy: str) -> str:
    """Why a step cut short is not run again: the policy, or calls that are not safe to repeat."""
    if policy == "fail":
        return "the environment's in-flight policy is 'fail'"
    return ("they take no idempotency key and are not annotated read-only or idempotent, so running them again "
            "could apply them twice")


def in_flight_error(batch_id: int, sample_id: int, task_id: str, index: int, calls: list[str] | None,
                    policy: str, why: str | None = None) -> str:
    """What a sample stopped for a check says: which step, which calls, how to check and go on."""
    what = f"call(s) {', '.join(calls)}" if calls else "its calls"
    return (f"{IN_FLIGHT_STOPPED}step {index} of task {task_id} may have executed before the process died: {what}; "
            f"{why or in_flight_why(policy)}. Check the server's state for this sample (did the call take effect?); "
            f"if it did not, `agentbatch retry {batch_id} --in-flight-checked {sample_id}` runs the step again")
