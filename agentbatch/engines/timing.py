"""Timing models: how long an engine that produces a known answer takes to produce it.

The scripted engine (and replay) know *what* the assistant says; a timing model decides *when* it
is said, by waiting in real time. One timing model instance serves one engine worker, so models
with shared state (a batch of running requests, a KV cache) see all of that worker's requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentbatch.protocols.engine import ChatRequest, ChatResult, Message
from agentbatch.protocols.tokens import ChatPrompt


@dataclass(slots=True)
class Timing:
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cached_prompt_tokens: int | None = None  # None: this timing model has no prefix cache
    recomputed_tokens: int = 0

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


class TimingModel(Protocol):
    async def run(
        self, *, request_id: str, sample_id: int, prompt: Sequence[int], output_tokens: int, priority: int | None
    ) -> Timing:
        """Wait (in real time) as long as the engine would take; return the split of that time."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class TokenTiming:
    """Latency = overhead + prompt tokens x prefill cost + output tokens x decode cost; no contention.

    Defaults are of the order of an 8B model on one H100 at moderate load (decode ~8 ms/token would
    be slow; we use 4 ms so demos stay short).
    """

    overhead_s: float = 0.010
    per_prompt_token_s: float = 0.00002
    per_output_token_s: float = 0.002
    scale: float = 1.0  # multiply every duration (e.g. 0 for no waiting at all)

    async def run(
        self, *, request_id: str, sample_id: int, prompt: Sequence[int], output_tokens: int, priority: int | None
    ) -> Timing:
        prefill = self.scale * (self.overhead_s + len(prompt) * self.per_prompt_token_s)
        decode = self.scale * output_tokens * self.per_output_token_s
        start = time.perf_counter()
        if prefill + decode > 0:
            await asyncio.sleep(prefill + decode)
        late = max(0.0, time.perf_counter() - start - prefill - decode)  # event-loop delay
        return Timing(queue_s=late, prefill_s=prefill, decode_s=decode)

    async def aclose(self) -> None:
        return None


async def timed_completion(
    timing: TimingModel, *, worker: str, request_id: str, request: ChatRequest, message: Message, output_tokens: int
) -> ChatResult:
    """An answer known in advance (scripted, replayed), delivered when the timing model says."""
    prompt = ChatPrompt(request.messages, request.tools)
    t = await timing.run(request_id=request_id, sample_id=request.sample_id, prompt=prompt,
                         output_tokens=output_tokens, priority=request.priority)
    return ChatResult(
        message=message, prompt_tokens=len(prompt), output_tokens=output_tokens,
        cached_prompt_tokens=t.cached_prompt_tokens, recomputed_tokens=t.recomputed_tokens,
        queue_s=t.queue_s, prefill_s=t.prefill_s, decode_s=t.decode_s, latency_s=t.total_s, worker=worker,
    )


TIMING_MODELS: dict[str, str] = {
    "token": "agentbatch.engines.timing:TokenTiming",
    "simulated": "agentbatch.engines.sim_timing:SimulatedTiming",
}


def make_timing(params: dict[str, Any] | None) -> TimingModel:
    """Build a timing model from config: {"kind": "token", ...params}. Entries are import paths."""
    import importlib

    params = dict(params or {"kind": "token"})
    kind = params.pop("kind", "token")
    try:
        path = TIMING_MODELS[kind]
    except KeyError:
        raise ValueError(f"unknown timing kind {kind!r}; expected one of {sorted(TIMING_MODELS)}") from None
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)(**params)
