"""The scripted engine: answers with the task's ground-truth tool calls.

It does real work on the environment side (every call is executed and scored by the workload's own
checker) without a GPU. Its latency comes from a pluggable timing model (see `timing.py`), one
instance per worker. Stateless across requests: what to say next is derived from the messages, so
a resumed sample continues exactly where it stopped.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from pydantic import Field

from agentbatch.engines.builtin import MAX_WORKERS, TimingParams
from agentbatch.engines.timing import TimingModel, make_timing, timed_completion
from agentbatch.protocols.engine import ChatRequest, ChatResult, Message
from agentbatch.protocols.environment import GroundTruthSource, GroundTruthTurn, TaskSpec, ground_truth_turns
from agentbatch.protocols.plugins import PluginParams
from agentbatch.protocols.tokens import count_tokens, render_message

GroundTruth = list[GroundTruthTurn]  # per user turn, the calls {"name", "arguments"} and the final text
END_OF_TURN_TEXT = "Done."  # a turn's final text when its ground truth gives none


def turn_position(messages: list[Message]) -> tuple[int, int]:
    """(index of the current user turn, tool calls already made in it) from a conversation."""
    turn, calls, prev_role = -1, 0, None
    for m in messages:
        role = m.get("role")
        if role in ("user", "system") and prev_role not in ("user", "system"):
            turn, calls = turn + 1, 0
        elif role == "assistant":
            calls += len(m.get("tool_calls") or [])
        prev_role = role
    return max(turn, 0), calls


class ScriptedEngine:
    def __init__(
        self,
        name: str,
        ground_truth: Callable[[str], GroundTruth],
        timing: TimingModel,
        calls_per_step: int = 1,
    ) -> None:
        self.name = name
        self._ground_truth = ground_truth
        self.timing = timing
        self.calls_per_step = max(1, calls_per_step)
        self._ids = itertools.count()

    def next_message(self, request: ChatRequest) -> Message:
        turns = self._ground_truth(request.task_id)
        turn, done_calls = turn_position(request.messages)
        current = turns[turn] if turn < len(turns) else GroundTruthTurn()
        pending = current.calls[done_calls:]
        if not pending:
            text = END_OF_TURN_TEXT if current.final_text is None else current.final_text
            return {"role": "assistant", "content": text}
        calls = [
            {
                "id": f"call_{request.step_index}_{i}",  # unique within the conversation
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for i, c in enumerate(pending[: self.calls_per_step])
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}

    async def complete(self, request: ChatRequest) -> ChatResult:
        message = self.next_message(request)
        output_tokens = request.max_tokens if request.ignore_eos and request.max_tokens else count_tokens(
            render_message(message)
        )
        return await timed_completion(self.timing, worker=self.name, request_id=f"{self.name}-{next(self._ids)}",
                                      request=request, message=message, output_tokens=output_tokens)

    async def aclose(self) -> None:
        await self.timing.aclose()


def ground_truth_lookup(workload: Any) -> Callable[[str], GroundTruth]:
    """Ground truth by task id: the workload's `ground_truth(task)` (given the full task) if it has
    one, else the task's `data["ground_truth"]`."""
    cache: dict[str, GroundTruth] = {}
    by_id: dict[str, TaskSpec] = {}

    def lookup(task_id: str) -> GroundTruth:
        if task_id not in cache:
            if not by_id:
                by_id.update({t.task_id: t for t in workload.tasks()})
            task = by_id.get(task_id, TaskSpec(task_id=task_id))
            if isinstance(workload, GroundTruthSource):
                raw = workload.ground_truth(task)
            elif "ground_truth" in task.data:
                raw = task.data["ground_truth"]
            else:
                raise ValueError(f"task {task_id!r}: the scripted engine needs ground truth (the workload's "
                                 "ground_truth(task) or the task's data['ground_truth'])")
            cache[task_id] = ground_truth_turns(raw)
        return cache[task_id]

    return lookup


class ScriptedParams(PluginParams):
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="engine workers")
    timing: TimingParams | None = Field(None, description='timing model, e.g. {"kind": "simulated"}')
    calls_per_step: int = Field(1, ge=1, le=1000, description="ground-truth calls sent per assistant turn")


def build_scripted_workers(params: dict[str, Any], workload: Any) -> list[ScriptedEngine]:
    """params: workers (int, default 1), timing ({"kind": ..., ...}), calls_per_step (int)."""
    p = ScriptedParams.model_validate(params)
    workers, calls_per_step = p.workers, p.calls_per_step
    timing = p.timing.model_dump() if p.timing else None
    lookup = ground_truth_lookup(workload)
    return [
        ScriptedEngine(f"scripted-{i}", lookup, make_timing(timing), calls_per_step=calls_per_step)
        for i in range(workers)
    ]


build_scripted_workers.Params = ScriptedParams  # type: ignore[attr-defined]  # a plugin's Params (protocols/plugins.py)
