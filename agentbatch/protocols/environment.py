"""The environment interface: reset for a task, execute an assistant turn, score at the end.

Every inference step is followed by one environment step. If the assistant message carries tool
calls, the environment executes them and returns one tool message per call. If it carries none,
the environment advances the conversation (next user turn) or says the sample is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentbatch.protocols.engine import Message, ToolSchema


@dataclass(slots=True)
class TaskSpec:
    """One task of a workload, as stored with the sample."""

    task_id: str
    data: dict[str, Any] = field(default_factory=dict)  # workload-specific, JSON-serialisable


@dataclass(slots=True)
class EnvReset:
    tools: list[ToolSchema]
    messages: list[Message]  # initial messages (system and first user turn)


@dataclass(slots=True)
class EnvResult:
    messages: list[Message]  # tool results and/or the next user message
    done: bool = False
    tool_calls: int = 0  # how many tool calls were executed
    tool_errors: int = 0  # calls whose result was an error observation (not a failure)
    info: dict[str, Any] = field(default_factory=dict)


class EnvironmentFailure(Exception):
    """An infrastructure failure of the environment (not a tool error): may be retried."""


@runtime_checkable
class Environment(Protocol):
    """One sample's environment instance. Created per sample by an `EnvironmentFactory`."""

    async def reset(self, task: TaskSpec) -> EnvReset: ...

    async def step(self, assistant: Message) -> EnvResult: ...

    async def restore(self, assistants: list[Message]) -> None:
        """Bring a fresh instance to the state after the given recorded assistant turns (resume).

        The recorded observations are reused as they are; this only rebuilds internal state.
        """
        ...

    async def score(self) -> dict[str, Any]:
        """Final result; must contain "score" (float in [0, 1]) and may add details."""
        ...

    async def close(self) -> None: ...


class EnvironmentFactory(Protocol):
    """Makes the environments of one workload and lists its tasks."""

    name: str

    def tasks(self) -> list[TaskSpec]: ...

    def create(self, task: TaskSpec) -> Environment: ...

    async def aclose(self) -> None: ...
