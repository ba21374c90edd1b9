"""After a crash: ask a sample's environment whether a step cut short ran (`protocols/in_flight.py`).

A resume keeps a sample whose external-state step was cut short running when its workload reconciles
(`flows/leased.py` settle_in_flight). Once the sample's fresh environment is reset and restored, its
`reconcile` hook is asked about that step: "ran" → the step is recorded with the result the
environment reports and not executed again; "not_run" → it runs again; "unknown" (or a hook that
fails) → the sample stops with the error a resume without a hook writes (`retry --in-flight-checked`
goes on once someone checked; the environment is then not asked again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agentbatch.db.models import MAY_HAVE_EXECUTED
from agentbatch.db.store import StepHistory
from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import UNSAFE_CALLS, EnvResult
from agentbatch.protocols.in_flight import Reconciled, applied_result, in_flight_error

log = logging.getLogger(__name__)

IN_FLIGHT = "in_flight"  # SampleRun.meta key: the step a crash cut short, still to reconcile
ANSWER = "reconciled"  # SampleRun.meta key: the environment's answer, for the step when it runs


@dataclass(frozen=True, slots=True)
class InFlightStep:
    index: int
    calls: list[str] | None  # the calls recorded as unsafe to repeat (None: not recorded)


@dataclass(frozen=True, slots=True)
class Answer:
    index: int
    reconciled: Reconciled


def in_flight_step(history: StepHistory) -> InFlightStep | None:
    """The sample's next step when a crash cut it short and nobody checked it since (its latest attempt
    is flagged "may have executed"), unless every call of it is safe to repeat."""
    index = len(history.completed)
    last = history.latest.get(index)
    if last is None or last.error != MAY_HAVE_EXECUTED:
        return None
    calls = last.request.get(UNSAFE_CALLS) if isinstance(last.request, dict) else None
    if calls == []:
        return None
    return InFlightStep(index, None if calls is None else [str(c) for c in calls])


async def reconcile_in_flight(batch: Any, sample_id: int, task_id: str, env: Any, assistant: Message | None,
                              meta: dict[str, Any]) -> str | None:
    """Ask the environment about the step in `meta[IN_FLIGHT]` (left by the rebuild); keeps its answer
    in `meta[ANSWER]` for the step. Returns the error that stops the sample ("unknown"), else None."""
    step: InFlightStep | None = meta.pop(IN_FLIGHT, None)
    hook = getattr(env, "reconcile", None)
    if step is None or hook is None or assistant is None:
        return None
    try:
        answer = await hook(assistant)
        if not isinstance(answer, Reconciled):
            raise TypeError(f"reconcile returned {type(answer).__name__}, not Reconciled")
    except Exception as exc:  # noqa: BLE001 - a hook that cannot tell is an "unknown"
        answer = Reconciled("unknown", detail=f"reconcile failed: {type(exc).__name__}: {exc}")
    log.warning("sample %s: step %s was cut short by a crash; the environment says: %s%s", sample_id, step.index,
                answer.status, f" ({answer.detail})" if answer.detail else "")
    if answer.status == "unknown":
        why = "the environment cannot tell whether they took effect" + (f" ({answer.detail})" if answer.detail else "")
        return in_flight_error(batch.batch_id, sample_id, task_id, step.index, step.calls, "retry", why)
    meta[ANSWER] = Answer(step.index, answer)
    return None


def reconciled_result(meta: dict[str, Any], index: int, assistant: Message) -> tuple[str | None, EnvResult | None]:
    """For the step at `index`: what the environment answered after a crash (None: not asked), and the
    step's result when it said "ran" (the step is then not executed)."""
    answer: Answer | None = meta.get(ANSWER)
    if answer is None or answer.index != index:
        return None, None
    del meta[ANSWER]
    status = answer.reconciled.status
    if status != "ran":
        return status, None
    return status, answer.reconciled.result or applied_result(assistant)
