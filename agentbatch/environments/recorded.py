"""The recorded environment: replays a trace's observations after the recorded durations.

Workload kind "recorded", params: `trace` (a Parquet trace file), `time_scale` (multiply every
recorded environment duration; 0 = no waiting), `samples` (replay only the first N). The score of a
sample is the recorded score, so a replay's scores equal the recording's by construction, whatever
the policies. Task ids are the recorded ones; a task id that occurs several times in the trace gets
"#k" appended from its second occurrence on, so every replayed sample maps to one recorded sample.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import (
    EnvironmentFailure,
    EnvReset,
    EnvResult,
    RecordedTurn,
    RestoreMode,
    TaskSpec,
)
from agentbatch.traces.conversation import initial_messages, observation_messages
from agentbatch.traces.parquet import read_trace
from agentbatch.traces.schema import Trace, TraceSample


class RecordedWorkload:
    name = "recorded"

    def __init__(self, trace: str | Trace, time_scale: float = 1.0, samples: int | None = None) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.trace = read_trace(trace) if not isinstance(trace, Trace) else trace
        self.time_scale = float(time_scale)
        chosen = self.trace.samples[:samples] if samples is not None else self.trace.samples
        self._by_task: dict[str, TraceSample] = {}
        seen: dict[str, int] = {}
        self._specs: list[TaskSpec] = []
        for s in chosen:
            k = seen.get(s.task_id, 0)
            seen[s.task_id] = k + 1
            tid = s.task_id if k == 0 else f"{s.task_id}#{k}"
            self._by_task[tid] = s
            self._specs.append(TaskSpec(task_id=tid, data={"trace_sample": s.index, "task_id": s.task_id}))

    def tasks(self) -> list[TaskSpec]:
        return list(self._specs)

    def sample(self, task_id: str) -> TraceSample:
        try:
            return self._by_task[task_id]
        except KeyError:
            raise KeyError(f"task {task_id!r} is not in the recorded trace") from None

    def create(self, task: TaskSpec) -> RecordedEnvironment:
        return RecordedEnvironment(self.sample(task.task_id), self.time_scale)

    async def aclose(self) -> None:
        return None


class RecordedEnvironment:
    restore_mode: RestoreMode = "replay"  # nothing to re-execute: only the position in the recording
    blocking = False

    def __init__(self, sample: TraceSample, time_scale: float) -> None:
        self.sample = sample
        self.time_scale = time_scale
        self._env_steps = sample.environment_steps
        self._next = 0  # index into the recorded environment steps

    async def reset(self, task: TaskSpec) -> EnvReset:
        self._next = 0
        return EnvReset(tools=list(self.sample.tools or []), messages=initial_messages(self.sample))

    async def step(self, assistant: Message) -> EnvResult:
        if self._next >= len(self._env_steps):
            raise EnvironmentFailure(
                f"sample {self.sample.task_id}: the recording has only {len(self._env_steps)} environment steps"
            )
        st = self._env_steps[self._next]
        self._next += 1
        delay = (st.duration_s or 0.0) * self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)
        done = st.done or self._next == len(self._env_steps)
        info: dict[str, Any] = {"recorded_step": st.index, "recorded_duration_s": st.duration_s}
        if st.tools is not None:  # the recorded environment changed the tool set here
            info["tools"] = st.tools
        return EnvResult(
            messages=observation_messages(self.sample, st),
            done=done,
            tool_calls=st.tool_calls or 0,
            info=info,
        )

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        # Each assistant turn was answered by one recorded environment step.
        self._next = min(len(pairs), len(self._env_steps))

    async def score(self) -> dict[str, Any]:
        result = dict(self.sample.result or {})
        result["score"] = float(self.sample.score or 0.0)
        result["recorded"] = True
        return result

    async def close(self) -> None:
        return None
