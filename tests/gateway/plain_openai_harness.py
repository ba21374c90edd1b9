"""A plain agent loop on the `openai` SDK: what a team's own harness looks like. It imports nothing
from agentbatch; the tests point it at the gateway (or straight at a worker) by base URL.

The "model" is whatever answers at the base URL; `policy` may add fields to each request's body
(the tests' ground-truth answers travel as the simulated server's `agentbatch_response`). The
environment is the harness's own: `reset()` gives the first messages and tools, `step(message)`
runs the assistant's tool calls (or moves to the next user turn) and says when the task is done.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from openai import AsyncOpenAI

Message = dict[str, Any]


@dataclass
class EnvStep:
    messages: list[Message]
    done: bool = False
    tools: list[dict[str, Any]] | None = None  # a new tool list, when it changed


class HarnessEnv(Protocol):
    async def reset(self) -> tuple[list[Message], list[dict[str, Any]]]: ...

    async def step(self, message: Message) -> EnvStep: ...


Policy = Callable[[list[Message]], dict[str, Any] | None]


async def _complete(client: AsyncOpenAI, stream: bool, **kwargs: Any) -> Message:
    if not stream:
        response = await client.chat.completions.create(**kwargs)
        return response.choices[0].message.model_dump(exclude_none=True)
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for i, call in enumerate(choice.delta.tool_calls or []):
                slot = calls.setdefault(call.index if call.index is not None else i,
                                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
    message: Message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def run_sample(client: AsyncOpenAI, model: str, sample_id: str, env: HarnessEnv, policy: Policy, *,
                     max_steps: int = 80, stream: bool = False,
                     on_step: Callable[[Message], Awaitable[None]] | None = None) -> list[Message]:
    """Run one sample to its end; returns the conversation."""
    messages, tools = await env.reset()
    for _ in range(max_steps):
        kwargs: dict[str, Any] = {"model": model, "messages": messages, "user": sample_id}
        if tools:
            kwargs["tools"] = tools
        extra = policy(messages)
        if extra:
            kwargs["extra_body"] = extra
        message = await _complete(client, stream, **kwargs)
        messages.append(message)
        if on_step is not None:
            await on_step(message)
        result = await env.step(json.loads(json.dumps(message)))
        messages.extend(result.messages)
        tools = result.tools or tools
        if result.done:
            break
    return messages
