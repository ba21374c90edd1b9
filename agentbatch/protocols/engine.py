"""The engine interface: one chat completion in the OpenAI chat-completions format."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # an OpenAI chat message: {"role": ..., "content": ..., "tool_calls": ...}
ToolSchema = dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}


@dataclass(slots=True)
class ChatRequest:
    messages: list[Message]
    tools: list[ToolSchema]
    sample_id: int = 0
    task_id: str = ""
    step_index: int = 0
    priority: int | None = None  # vLLM --scheduling-policy priority: lower runs first
    max_tokens: int | None = None
    ignore_eos: bool = False  # with max_tokens: force the output length (controlled replay)
    temperature: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ChatResult:
    message: Message  # the assistant message (may carry "tool_calls")
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int | None = None  # None: the engine does not say (no cache model)
    recomputed_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    latency_s: float = 0.0  # wall (or virtual) time from send to last token
    worker: str = ""
    finish_reason: str = "stop"


class EngineFailure(Exception):
    """The engine could not answer (connection, HTTP 5xx, a malformed answer): the request may be
    retried (`protocols/retry.py`). Engines raise it, not their HTTP client's own errors."""


@runtime_checkable
class Engine(Protocol):
    """One engine worker (or a client of one). `name` identifies the worker in the store."""

    name: str

    async def complete(self, request: ChatRequest) -> ChatResult: ...

    async def aclose(self) -> None: ...
