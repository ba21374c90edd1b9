"""The reconcile hook's runner side (`tasks/reconcile.py`): what each answer does to the step, a hook
that fails, and a blocking environment's hook run on its own loop thread."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from agentbatch.protocols.environment import IN_FLIGHT_STOPPED, EnvResult
from agentbatch.protocols.in_flight import Reconciled
from agentbatch.tasks.env_thread import off_the_loop
from agentbatch.tasks.reconcile import IN_FLIGHT, InFlightStep, reconcile_in_flight, reconciled_result

ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c0", "type": "function", "function": {"name": "refund", "arguments": "{}"}}]}
BATCH = SimpleNamespace(batch_id=7)


class Env:
    blocking = False

    def __init__(self, answer: Reconciled | Exception) -> None:
        self.answer = answer
        self.thread: str | None = None

    async def reconcile(self, assistant: dict[str, Any]) -> Reconciled:
        self.thread = threading.current_thread().name
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        pass


class Plain:
    blocking = True

    async def close(self) -> None:
        pass


def ask(env: Any) -> tuple[str | None, dict[str, Any]]:
    meta: dict[str, Any] = {IN_FLIGHT: InFlightStep(3, ["refund"])}
    stop = asyncio.run(reconcile_in_flight(BATCH, 11, "t1", env, ASSISTANT, meta))
    return stop, meta


def test_ran_without_a_result_records_each_call_as_applied() -> None:
    stop, meta = ask(Env(Reconciled("ran")))
    assert stop is None
    assert reconciled_result(meta, 2, ASSISTANT) == (None, None)  # another step: not this answer
    said, result = reconciled_result(meta, 3, ASSISTANT)
    assert said == "ran" and isinstance(result, EnvResult) and result.tool_calls == 1
    assert result.messages[0]["tool_call_id"] == "c0" and "not recorded" in result.messages[0]["content"]
    assert reconciled_result(meta, 3, ASSISTANT) == (None, None)  # used once


def test_not_run_runs_the_step_and_unknown_or_a_failing_hook_stops_the_sample() -> None:
    stop, meta = ask(Env(Reconciled("not_run")))
    assert stop is None and reconciled_result(meta, 3, ASSISTANT) == ("not_run", None)
    for answer, said in ((Reconciled("unknown", detail="no trace kept"), "no trace kept"),
                         (RuntimeError("server down"), "reconcile failed: RuntimeError: server down")):
        stop, _ = ask(Env(answer))
        assert stop is not None and stop.startswith(IN_FLIGHT_STOPPED) and said in stop
        assert "step 3 of task t1" in stop and "refund" in stop and "retry 7 --in-flight-checked 11" in stop
    with pytest.raises(ValueError, match="Reconciled.status"):
        Reconciled("maybe")  # type: ignore[arg-type]  # a status outside the protocol is refused


def test_no_hook_or_nothing_in_flight_asks_nothing() -> None:
    assert ask(SimpleNamespace())[0] is None
    env = Env(RuntimeError("must not be asked"))
    assert asyncio.run(reconcile_in_flight(BATCH, 11, "t1", env, ASSISTANT, {})) is None and env.thread is None


def test_a_blocking_environments_hook_runs_on_its_own_loop_thread() -> None:
    env = Env(Reconciled("not_run"))
    env.blocking = True
    wrapped = off_the_loop(env, 5.0)

    async def main() -> Reconciled:
        try:
            return await wrapped.reconcile(ASSISTANT)
        finally:
            await wrapped.close()

    assert asyncio.run(main()).status == "not_run"
    assert env.thread is not None and env.thread.startswith("agentbatch-env-")
    plain = off_the_loop(Plain(), 5.0)
    assert getattr(plain, "reconcile", None) is None  # no hook: none forwarded
    asyncio.run(plain.close())
