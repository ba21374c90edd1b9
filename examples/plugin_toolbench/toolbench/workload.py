"""The "toolbench" workload: small deterministic tool-use tasks in two suites (groups).

- "arith": compute (a + b) * c with the `add` and `mul` tools; scored on the final answer.
- "notes": two user turns — save a note, then ask for it back; scored on the saved state and the
  final answer of the last turn.

Every task has ground truth (the calls and the final text of each turn), so the stock scripted
engine answers it perfectly; the state lives in the environment instance (restore by replay).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, Literal

from pydantic import Field

from agentbatch.protocols.environment import EnvReset, EnvResult, GroundTruthTurn, RecordedTurn, TaskSpec
from agentbatch.protocols.plugins import PluginParams

SUITES = ("arith", "notes")


def _tool(name: str, description: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in props.items()},
                       "required": list(props)},
    }}


TOOLS = [
    _tool("add", "a + b", a="integer", b="integer"),
    _tool("mul", "a * b", a="integer", b="integer"),
    _tool("note_write", "save text under key", key="string", text="string"),
    _tool("note_read", "the text saved under key", key="string"),
]


class ToolBenchParams(PluginParams):
    suites: list[Literal["arith", "notes"]] = Field(default_factory=lambda: list(SUITES), min_length=1)
    tasks_per_suite: int = Field(4, ge=1, le=10_000)
    seed: int = 0
    delay_s: float = Field(0.0, ge=0, le=60, description="simulated latency of each tool call")


class ToolBench:
    """The workload (an `EnvironmentFactory`); its parameters are `ToolBenchParams`."""

    name = "toolbench"
    Params = ToolBenchParams

    def __init__(self, suites: list[str] | None = None, tasks_per_suite: int = 4, seed: int = 0,
                 delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        rng = random.Random(seed)
        self._tasks = [self._make(suite, i, rng) for suite in (suites or SUITES) for i in range(tasks_per_suite)]

    @staticmethod
    def _make(suite: str, i: int, rng: random.Random) -> TaskSpec:
        if suite == "arith":
            a, b, c = rng.randint(1, 99), rng.randint(1, 99), rng.randint(2, 9)
            data = {"turns": [f"What is ({a} + {b}) * {c}? Use the tools, then answer with the number only."],
                    "a": a, "b": b, "c": c, "answer": str((a + b) * c)}
        else:
            key, text = f"k{i}", f"remember {rng.randint(1000, 9999)}"
            data = {"turns": [f"Save the note {text!r} under the key {key!r}.",
                              f"What is the note under {key!r}? Answer with its text only."],
                    "key": key, "text": text, "answer": text}
        return TaskSpec(task_id=f"{suite}-{i}", data=data, group=suite)

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def create(self, task: TaskSpec) -> ToolBenchEnv:
        return ToolBenchEnv(task, self.delay_s)

    def ground_truth(self, task: TaskSpec) -> list[GroundTruthTurn]:
        d = task.data
        if task.group == "arith":
            total = d["a"] + d["b"]
            return [GroundTruthTurn([{"name": "add", "arguments": {"a": d["a"], "b": d["b"]}},
                                     {"name": "mul", "arguments": {"a": total, "b": d["c"]}}], d["answer"])]
        return [GroundTruthTurn([{"name": "note_write", "arguments": {"key": d["key"], "text": d["text"]}}], "saved"),
                GroundTruthTurn([{"name": "note_read", "arguments": {"key": d["key"]}}], d["answer"])]

    async def aclose(self) -> None:
        return None


class ToolBenchEnv:
    """One sample: its notes and the assistant's final text of each turn."""

    restore_mode: Literal["replay", "external"] = "replay"  # the notes live in this instance
    blocking = False  # nothing synchronous beyond microseconds

    def __init__(self, task: TaskSpec, delay_s: float) -> None:
        self.task, self.delay_s = task, delay_s
        self.notes: dict[str, str] = {}
        self.turn = 0
        self.finals: list[str] = []

    async def reset(self, task: TaskSpec) -> EnvReset:
        self.task, self.notes, self.turn, self.finals = task, {}, 0, []
        return EnvReset(tools=list(TOOLS), messages=[{"role": "user", "content": task.data["turns"][0]}])

    async def step(self, assistant: dict[str, Any]) -> EnvResult:
        calls = assistant.get("tool_calls") or []
        if not calls:  # the turn's final answer: the next user turn, or done
            self.finals.append(str(assistant.get("content") or "").strip())
            self.turn += 1
            turns = self.task.data["turns"]
            if self.turn < len(turns):
                return EnvResult(messages=[{"role": "user", "content": turns[self.turn]}])
            return EnvResult(messages=[], done=True)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out, errors = [], 0
        for call in calls:
            text, failed = self._call(call["function"]["name"], call["function"].get("arguments") or "{}")
            errors += failed
            out.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": text})
        return EnvResult(messages=out, tool_calls=len(calls), tool_errors=errors)

    def _call(self, name: str, raw: str) -> tuple[str, bool]:
        try:
            args = json.loads(raw)
            if name == "add":
                return str(int(args["a"]) + int(args["b"])), False
            if name == "mul":
                return str(int(args["a"]) * int(args["b"])), False
            if name == "note_write":
                self.notes[str(args["key"])] = str(args["text"])
                return "ok", False
            if name == "note_read":
                return self.notes.get(str(args["key"]), "error: no such note"), False
        except (ValueError, KeyError, TypeError) as exc:
            return f"error: {exc}", True
        return f"error: unknown tool {name!r}", True

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        for assistant, _results in pairs:  # in-process state: re-executing rebuilds it
            await self.step(assistant)

    async def score(self) -> dict[str, Any]:
        d = self.task.data
        answered = bool(self.finals) and self.finals[-1] == d["answer"]
        state_ok = self.task.group != "notes" or self.notes.get(d["key"]) == d["text"]
        return {"score": float(answered and state_ok), "final": self.finals[-1] if self.finals else None}

    async def close(self) -> None:
        self.notes.clear()
