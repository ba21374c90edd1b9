"""A test engine that answers a chosen set of tasks wrongly: the scripted engine, except that for the
task ids in `wrong_tasks` it ends every turn at once without a tool call (the bfcl checker then
scores the task 0). A config names it as engine kind "wrong_engine:build_wrong_workers"."""

from __future__ import annotations

from typing import Any

from agentbatch.engines.scripted import ScriptedEngine, build_scripted_workers
from agentbatch.protocols.engine import ChatRequest, Message


class WrongOnSome(ScriptedEngine):
    wrong: frozenset[str] = frozenset()

    def next_message(self, request: ChatRequest) -> Message:
        if request.task_id in self.wrong:
            return {"role": "assistant", "content": "I cannot help with that."}
        return super().next_message(request)


def build_wrong_workers(params: dict[str, Any], workload: Any) -> list[ScriptedEngine]:
    """params: wrong_tasks (task ids answered wrongly) and the scripted engine's own params."""
    params = dict(params)
    wrong = frozenset(params.pop("wrong_tasks", []))
    engines = build_scripted_workers(params, workload)
    for e in engines:
        e.__class__ = WrongOnSome
        e.wrong = wrong  # type: ignore[attr-defined]
    return engines
