"""BFCL with injected faults, as a workload plugin ("reliability_workloads:FaultyBfcl").

Faults apply to the tasks by their position in `tasks()`: the first `score_errors` tasks have a scorer
that always raises, the next `score_flaky` one whose first call raises; the first `block_tasks` tasks
run their first tool step with a synchronous `time.sleep(block_s)` (a tool that blocks), writing its
start and end times to `marks_dir`. `blocking` declares the environment as blocking.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from agentbatch.environments.bfcl import BfclParams, BfclWorkload
from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import EnvResult, TaskSpec


class FaultyParams(BfclParams):
    score_errors: int = Field(0, ge=0)
    score_flaky: int = Field(0, ge=0)
    block_tasks: int = Field(0, ge=0)
    block_s: float = Field(0.0, ge=0)
    blocking: bool = False
    marks_dir: str | None = None


class FaultyEnvironment:
    def __init__(self, inner: Any, fault: str | None, workload: FaultyBfcl) -> None:
        self.inner, self.fault, self.workload = inner, fault, workload
        self.blocking = workload.blocking
        self.score_calls = 0
        self.blocked = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def reset(self, task: TaskSpec) -> Any:
        self.task = task
        return await self.inner.reset(task)

    async def step(self, assistant: Message) -> EnvResult:
        if self.fault == "block" and not self.blocked and assistant.get("tool_calls"):
            self.blocked = True
            start = time.time()
            time.sleep(self.workload.block_s)  # a synchronous tool: holds whatever thread runs it
            self.workload.mark(self.task.task_id, start, time.time())
        return await self.inner.step(assistant)

    async def restore(self, pairs: list[Any]) -> None:
        await self.inner.restore(pairs)

    async def score(self) -> dict[str, Any]:
        self.score_calls += 1
        if self.fault == "score_error" or (self.fault == "score_flaky" and self.score_calls == 1):
            raise RuntimeError(f"scorer crashed on {self.task.task_id}")
        return await self.inner.score()

    async def close(self) -> None:
        await self.inner.close()


class FaultyBfcl(BfclWorkload):
    name = "faulty-bfcl"
    Params = FaultyParams

    def __init__(self, score_errors: int = 0, score_flaky: int = 0, block_tasks: int = 0, block_s: float = 0.0,
                 blocking: bool = False, marks_dir: str | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.blocking, self.block_s, self.marks_dir = blocking, block_s, marks_dir
        ids = [t.task_id for t in super().tasks()]
        self.faults: dict[str, str] = {}
        for tid in ids[:score_errors]:
            self.faults[tid] = "score_error"
        for tid in ids[score_errors:score_errors + score_flaky]:
            self.faults[tid] = "score_flaky"
        for tid in ids[:block_tasks]:
            self.faults[tid] = "block"

    def create(self, task: TaskSpec) -> FaultyEnvironment:
        return FaultyEnvironment(super().create(task), self.faults.get(task.task_id), self)

    def mark(self, task_id: str, start: float, end: float) -> None:
        if self.marks_dir:
            Path(self.marks_dir, f"{task_id}.json").write_text(json.dumps({"start": start, "end": end}))
