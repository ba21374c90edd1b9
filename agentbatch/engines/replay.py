"""The replay engine: real (or timed) inference on the recorded conversation.

Each request is the recorded conversation prefix (the recorded environment returned the recorded
observations, and this engine the recorded assistant turns). It is sent to an inner engine with
`max_tokens` = the recorded output length and `ignore_eos`, so the engine does the recorded amount
of work; the measured timing and token counts are returned with the RECORDED assistant message, so
the conversation, and hence the score, stays the recorded one.

Engine kind "replay"; params:
  inner: "openai" (default when `endpoints` is given) or "timing" (no server: a timing model, e.g.
         {"kind": "token"} or the simulated engine's real-time model, waits as long as the engine would)
  endpoints / timeout_s: as for the "openai" engine;  timing: the timing model config;  workers: N
The workload must be the "recorded" one (it maps task ids to recorded samples).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, model_validator

from agentbatch.engines.builtin import MAX_WORKERS, Endpoints, TimingParams
from agentbatch.engines.timing import TimingModel, make_timing, timed_completion
from agentbatch.environments.recorded import RecordedWorkload
from agentbatch.protocols.engine import ChatRequest, ChatResult, Engine
from agentbatch.protocols.plugins import PluginParams
from agentbatch.traces.conversation import assistant_message
from agentbatch.traces.schema import TraceStep


class ReplayMismatch(Exception):
    """The request does not match the recording (wrong workload, or a diverged conversation)."""


class ReplayEngine:
    def __init__(
        self,
        name: str,
        workload: RecordedWorkload,
        inner: Engine | None = None,
        timing: TimingModel | None = None,
    ) -> None:
        if (inner is None) == (timing is None):
            raise ValueError("give exactly one of inner (an engine) or timing (a timing model)")
        self.name = name
        self.workload = workload
        self.inner = inner
        self.timing = timing
        self._ids = itertools.count()

    def recorded_step(self, request: ChatRequest) -> tuple[TraceStep, dict[str, Any]]:
        sample = self.workload.sample(request.task_id)
        # The j-th inference call has j assistant turns before it: robust to how steps are numbered.
        j = sum(1 for m in request.messages if m.get("role") == "assistant")
        inference = sample.inference_steps
        if j >= len(inference):
            raise ReplayMismatch(f"{request.task_id}: inference call {j + 1} but the recording has {len(inference)}")
        step = inference[j]
        return step, assistant_message(sample, step)

    async def complete(self, request: ChatRequest) -> ChatResult:
        step, message = self.recorded_step(request)
        out_tokens = max(1, int(step.output_tokens or 1))
        if self.inner is not None:
            forced = replace(request, max_tokens=out_tokens, ignore_eos=True)
            res = await self.inner.complete(forced)
            return replace(res, message=message, worker=self.name)
        assert self.timing is not None
        return await timed_completion(self.timing, worker=self.name, request_id=f"{self.name}-{next(self._ids)}",
                                      request=request, message=message, output_tokens=out_tokens)

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()
        if self.timing is not None:
            await self.timing.aclose()


class ReplayParams(PluginParams):
    inner: Literal["openai", "timing"] | None = Field(
        None, description="openai (default when endpoints are given) or timing (no server)")
    endpoints: Endpoints | None = Field(None, description="as for the openai engine")
    timeout_s: float = Field(600.0, gt=0, le=86400)
    timing: TimingParams | None = None
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="workers of the timing model")

    @model_validator(mode="after")
    def _inner(self) -> ReplayParams:
        if self.inner is None:
            self.inner = "openai" if self.endpoints is not None else "timing"
        if self.inner == "openai" and not self.endpoints:
            raise ValueError("inner 'openai' needs endpoints")
        if self.inner == "timing" and self.endpoints is not None:
            raise ValueError("endpoints are for inner 'openai'")
        return self


def build_replay_workers(params: dict[str, Any], workload: Any) -> list[ReplayEngine]:
    if not isinstance(workload, RecordedWorkload):
        raise ValueError("engine kind 'replay' needs workload kind 'recorded' (it replays that trace)")
    p = ReplayParams.model_validate(params)
    if p.inner == "openai":
        from agentbatch.engines.openai_http import build_openai_workers

        inner = build_openai_workers(p.model_dump(include={"endpoints", "timeout_s"}, exclude_none=True), workload)
        return [ReplayEngine(e.name, workload, inner=e) for e in inner]
    timing = p.timing.model_dump() if p.timing else None
    return [ReplayEngine(f"replay-{i}", workload, timing=make_timing(timing)) for i in range(p.workers)]


build_replay_workers.Params = ReplayParams  # type: ignore[attr-defined]  # a plugin's Params (protocols/plugins.py)
