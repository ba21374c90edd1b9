"""The "toolbench_lazy" engine: a baseline that never calls a tool and always answers the same text.

An engine factory takes the checked params and the workload and returns one `Engine` per worker.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentbatch.protocols.engine import ChatRequest, ChatResult
from agentbatch.protocols.plugins import PluginParams
from agentbatch.protocols.tokens import count_tokens, render_message


class LazyParams(PluginParams):
    workers: int = Field(1, ge=1, le=64)
    answer: str = Field("I don't know", max_length=1000)


class LazyEngine:
    def __init__(self, name: str, answer: str) -> None:
        self.name, self.answer = name, answer

    async def complete(self, request: ChatRequest) -> ChatResult:
        message = {"role": "assistant", "content": self.answer}
        prompt = sum(count_tokens(render_message(m)) for m in request.messages)
        return ChatResult(message=message, prompt_tokens=prompt, output_tokens=count_tokens(self.answer),
                          worker=self.name)

    async def aclose(self) -> None:
        return None


def build_lazy_workers(params: dict[str, Any], workload: Any) -> list[LazyEngine]:
    p = LazyParams.model_validate(params)
    return [LazyEngine(f"lazy-{i}", p.answer) for i in range(p.workers)]


build_lazy_workers.Params = LazyParams  # type: ignore[attr-defined]
