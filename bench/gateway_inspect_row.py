"""The inspect_ai row of `gateway_makespan.py`: the same recorded samples as an inspect_ai task.

The task replays each recorded sample with inspect's own model and tool machinery: each model turn
asks for the recorded output tokens and gets the recorded assistant message (the simulated worker's
`agentbatch_response`), which calls the MCP `sleep` tool for the recorded environment time; inspect
runs the call and the tool's answer is replaced by the recorded observation, so every run of a
sample sends the same messages. The score is the number of model turns the sample completed against
the recorded number.

- inspect direct: the competent inspect setup without agentbatch: every sample started at once
  (`max_samples` = all), session affinity by hash to the workers (`openai-api` per worker), the
  tool server over `mcp_server_http` with one semaphore of `env_slots` around the tool calls.
- inspect through the gateways: the unchanged task with `--model agentbatch/<model>` and the tools
  from `inspect_agentbatch.gateway_mcp_server()`; no semaphore; samples end by the extension's hook.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import zlib
from pathlib import Path
from typing import Any

from gateway_makespan import scripted_answer
from gateway_overhead import MODEL

from agentbatch.traces.conversation import filler, initial_messages
from agentbatch.traces.schema import INFERENCE, TraceSample


def _inspect_messages(messages: list[dict[str, Any]]) -> list[Any]:
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser

    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


def replay_task(samples: list[TraceSample], env_scale: float, *, workers: list[str] | None,
                probe_url: str | None, env_slots: int, epochs: int) -> Any:
    """The recorded batch as an inspect Task. `workers`: direct (affinity by hash, tools at `probe_url`
    under a semaphore); None: through the gateway (the active agentbatch model and its /mcp)."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import GenerateConfig, execute_tools, get_model
    from inspect_ai.scorer import Score, Target, mean, scorer
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.tool import mcp_server_http

    by_id = {f"{s.task_id}-{s.index}": s for s in samples}
    guard: dict[str, asyncio.Semaphore] = {}

    @solver
    def replay():  # noqa: ANN202 - inspect's decorator
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            sample = by_id[str(state.sample_id)]
            if workers is not None:
                base = workers[zlib.crc32(sample.task_id.encode()) % len(workers)]
                model = get_model(f"openai-api/sim/{MODEL}", base_url=base, api_key="unused",
                                  config=GenerateConfig(max_connections=10_000))
                tools = [mcp_server_http(name="probe", url=probe_url or "", timeout=600)]
                slots = guard.setdefault("env", asyncio.Semaphore(env_slots))
            else:
                import inspect_agentbatch

                model, tools, slots = get_model(), [inspect_agentbatch.gateway_mcp_server(timeout=600)], None
            turns = 0
            for k, step in enumerate(sample.steps):
                if step.kind != INFERENCE:
                    continue
                config = GenerateConfig(max_tokens=max(1, step.output_tokens or 1), extra_body={
                    "ignore_eos": True, "agentbatch_response": scripted_answer(sample, k, env_scale)})
                output = await model.generate(state.messages, tools, config=config)
                state.messages.append(output.message)
                turns += 1
                if output.message.tool_calls:
                    if slots is not None:
                        async with slots:
                            result = await execute_tools(state.messages, tools)
                    else:
                        result = await execute_tools(state.messages, tools)
                    for message in result.messages:  # the recorded observation, not the live timestamps
                        message.content = filler(sample.steps[k + 1].obs_tokens or 1, f"obs/{sample.index}/{k + 1}")
                    state.messages.extend(result.messages)
            state.output.completion = str(turns)
            return state

        return solve

    @scorer(metrics=[mean()])
    def completed_turns():  # noqa: ANN202 - inspect's decorator
        async def score(state: TaskState, target: Target) -> Score:
            return Score(value=1.0 if state.output.completion == target.text else 0.0)

        return score

    dataset = MemoryDataset([
        Sample(id=key, input=_inspect_messages(initial_messages(s)),
               target=str(sum(1 for step in s.steps if step.kind == INFERENCE)))
        for key, s in by_id.items()])
    return Task(dataset=dataset, solver=replay(), scorer=completed_turns(), epochs=epochs, name="replay")


def run_inspect(task: Any, log_dir: Path, *, gateway_url: str | None, n_samples: int) -> tuple[float, Any]:
    """Run the task; returns (makespan in s, the eval log)."""
    from inspect_ai import eval as inspect_eval

    model = f"agentbatch/{MODEL}" if gateway_url else "mockllm/model"  # direct: the solver picks its workers
    start = time.perf_counter()
    (log,) = inspect_eval(task, model=model, model_base_url=gateway_url, log_dir=str(log_dir), display="none",
                          max_samples=n_samples, max_connections=10_000, max_subprocesses=n_samples,
                          fail_on_error=True, score_display=False)
    return time.perf_counter() - start, log


def trajectories(log: Any) -> dict[tuple[str, int], tuple[str, float]]:
    """Each (sample, epoch): a digest of its messages (roles, texts, tool calls) and its score."""
    out = {}
    for s in log.samples or []:
        shape = [(m.role, m.text, [(c.function, c.arguments) for c in getattr(m, "tool_calls", None) or []])
                 for m in s.messages]
        digest = hashlib.sha256(json.dumps(shape, default=str).encode()).hexdigest()[:16]
        out[(str(s.id), s.epoch)] = (digest, next(iter((s.scores or {}).values())).value)
    return out
