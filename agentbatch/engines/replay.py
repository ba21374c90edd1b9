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
from typing import Any

from agentbatch.engines.timing import TimingModel, make_timing, timed_completion
from agentbatch.environments.recorded import RecordedWorkload
from agentbatch.protocols.engine import ChatRequest, ChatResult, Engine
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


def build_replay_workers(params: dict[str, Any], workload: Any) -> list[ReplayEngine]:
    if not isinstance(workload, RecordedWorkload):
        raise ValueError("engine kind 'replay' needs workload kind 'recorded' (it replays that trace)")
    params = dict(params)
    inner_kind = params.pop("inner", "openai" if "endpoints" in params else "timing")
    if inner_kind == "openai":
        from agentbatch.engines.openai_http import build_openai_workers

        inner = build_openai_workers(params, workload)
        return [ReplayEngine(e.name, workload, inner=e) for e in inner]
    if inner_kind == "timing":
        workers = int(params.pop("workers", 1))
        timing = params.pop("timing", None)
        if params:
            raise ValueError(f"engine.params: unknown keys for the replay engine: {sorted(params)}")
        return [ReplayEngine(f"replay-{i}", workload, timing=make_timing(timing)) for i in range(workers)]
    raise ValueError(f"engine.params.inner: expected 'openai' or 'timing', got {inner_kind!r}")
