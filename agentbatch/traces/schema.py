"""The in-memory trace: a batch as a list of samples, each a chain of recorded steps.

A trace carries what a replay needs: per inference step the prompt and output token counts (and,
for recorded batches, the assistant message); per environment step its execution time and its
observation (messages, or only their token count for synthetic traces). Prompts are rebuilt with
their prefix structure: every inference prompt is the previous prompt + the previous output + the
observation, so `prompt_tokens` of step k+2 = prompt_tokens(k) + output_tokens(k) + obs_tokens(k+1)
(+ template overhead for recorded batches). Samples of one `prefix_group` share their first
`shared_prefix_tokens` prompt tokens (system prompt and tool schemas), as a prefix cache sees them.
Times are seconds relative to the batch start. docs/traces.md documents the Parquet columns.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

TRACE_VERSION = 1
INFERENCE = "inference"
ENVIRONMENT = "environment"


@dataclass(slots=True)
class TraceStep:
    index: int
    kind: str  # "inference" | "environment"
    duration_s: float  # service time: inference latency, or environment execution time (no queueing)
    enqueued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    prompt_tokens: int | None = None  # inference only
    cached_prompt_tokens: int | None = None
    recomputed_tokens: int | None = None
    output_tokens: int | None = None  # inference only
    prefill_s: float | None = None
    decode_s: float | None = None
    engine_queue_s: float | None = None
    obs_tokens: int | None = None  # environment only: tokens of the observation messages
    tool_calls: int | None = None
    done: bool = False  # environment only: the environment ended the sample here
    message: dict[str, Any] | None = None  # inference: the assistant message
    observation: list[dict[str, Any]] | None = None  # environment: the messages it returned
    request_messages: list[dict[str, Any]] | None = None  # only where the prompt was NOT the rebuilt one
    tools: list[dict[str, Any]] | None = None  # environment only: tool schemas it changed to (else None)


@dataclass(slots=True)
class TraceSample:
    index: int
    task_id: str
    steps: list[TraceStep] = field(default_factory=list)
    task: dict[str, Any] = field(default_factory=dict)
    score: float | None = None
    result: dict[str, Any] | None = None
    status: str = "completed"
    admitted_at: float | None = None
    finished_at: float | None = None
    tools: list[dict[str, Any]] | None = None  # tool schemas the sample saw
    messages: list[dict[str, Any]] | None = None  # initial messages (system + first user turn)
    prefix_group: str = ""
    shared_prefix_tokens: int = 0

    @property
    def inference_steps(self) -> list[TraceStep]:
        return [s for s in self.steps if s.kind == INFERENCE]

    @property
    def environment_steps(self) -> list[TraceStep]:
        return [s for s in self.steps if s.kind == ENVIRONMENT]


@dataclass(slots=True)
class Trace:
    samples: list[TraceSample]
    meta: dict[str, Any] = field(default_factory=dict)  # family, seed, params, source batch, capacities

    @property
    def num_steps(self) -> int:
        return sum(len(s.steps) for s in self.samples)

    def scores(self) -> list[float | None]:
        return [s.score for s in self.samples]

    def mean_score(self) -> float:
        vals = [s.score for s in self.samples if s.score is not None]
        return sum(vals) / len(vals) if vals else 0.0


def chain_priors(*traces: Trace) -> dict[str, float]:
    """Mean recorded chain length (steps, both kinds) per task id over earlier traces: the prior of
    history-aware CAAS (SampleProgress.prior_chain_steps)."""
    acc: dict[str, list[int]] = defaultdict(list)
    for trace in traces:
        for s in trace.samples:
            acc[s.task_id].append(len(s.steps))
    return {task: sum(v) / len(v) for task, v in acc.items()}
