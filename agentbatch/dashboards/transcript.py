"""One sample's transcript, read back from the store: its conversation (messages, tool calls with
their arguments, observations), its score and scorer output, its errors, and per step attempt the
timing (queued, running), worker, tokens and retries.

The runner and the gateway record steps in the same tables and the same request/response format
(`db/step_records.py`). What a step's `request`/`response` JSON holds is read in one place,
`step_messages`:

- inference: request `{"messages_from", "messages", ["tools"]}`: the messages new in this request
  (the runner: all on step 0, none later, as its conversation is rebuilt from the responses; a
  gateway: those new since the sample's previous request, which repeat the previous answer and the
  tool results the MCP tool gateway already recorded), response `{"message", "finish_reason", ["id"]}`;
- environment: request `{"from_step"}` (the runner) or `{"calls": [{"name", "server", "arguments"}]}`
  (a gateway tool call), response `{"messages": [tool/user ...], "done"}`.

Stores written before that format hold a gateway tool call as `{"tool", "server", "arguments"}`;
it is read too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from agentbatch.db.models import Sample, Step
from agentbatch.db.store import Store


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # as the model wrote them (JSON text, shown as is)
    call_id: str = ""


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    name: str = ""  # tool name of a tool message, when recorded


@dataclass
class StepView:
    """One attempt of one step."""

    index: int
    attempt: int
    kind: str
    status: str
    worker: str | None
    enqueued_at: float | None
    started_at: float | None
    finished_at: float | None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    inputs: list[Message] = field(default_factory=list)  # messages first seen in this step's request
    outputs: list[Message] = field(default_factory=list)  # the answer, or the observations
    call: ToolCall | None = None  # the tool call a gateway tool step ran

    @property
    def queued_s(self) -> float | None:
        return _span(self.enqueued_at, self.started_at)

    @property
    def running_s(self) -> float | None:
        return _span(self.started_at, self.finished_at)


@dataclass
class Transcript:
    batch_id: int
    sample_id: int
    index: int
    task_id: str
    group: str | None
    status: str
    score: float | None
    result: Any  # the scorer's output (samples.result)
    error: str | None
    admitted_at: float | None
    finished_at: float | None
    steps: list[StepView] = field(default_factory=list)

    @property
    def retries(self) -> int:
        return sum(1 for s in self.steps if s.status != "completed")

    @property
    def latency_s(self) -> float | None:
        return _span(self.admitted_at, self.finished_at)

    def tool_calls(self) -> list[ToolCall]:
        calls = [c for s in self.steps for m in s.outputs for c in m.tool_calls]
        return calls + [s.call for s in self.steps if s.call is not None]

    def observations(self) -> list[Message]:
        return [m for s in self.steps if s.kind == "environment" for m in s.outputs]


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def text_of(content: Any) -> str:
    """Message content as text: a string, OpenAI content parts (their text), or JSON of anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) and "text" in p else _json(p) for p in content)
    return _json(content)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _tool_call(raw: Any) -> ToolCall:
    if not isinstance(raw, dict):
        return ToolCall(name="?", arguments=_json(raw))
    function = raw.get("function")
    fn = function if isinstance(function, dict) else raw
    return ToolCall(name=str(fn.get("name", "?")), arguments=_json(fn.get("arguments", "")),
                    call_id=str(raw.get("id") or ""))


def message_of(raw: Any) -> Message:
    if not isinstance(raw, dict):
        return Message(role="?", content=text_of(raw))
    calls = tuple(_tool_call(c) for c in raw.get("tool_calls") or ())
    return Message(role=str(raw.get("role", "?")), content=text_of(raw.get("content")), tool_calls=calls,
                   name=str(raw.get("name") or ""))


def step_messages(kind: str, request: Any, response: Any) -> tuple[list[Message], list[Message], ToolCall | None]:
    """(messages first sent in this step's request, what the step returned, the tool call a gateway
    tool step ran) from a step row's request/response JSON. The one place that knows their formats."""
    request = request if isinstance(request, dict) else {}
    response = response if isinstance(response, dict) else {}
    inputs = [message_of(m) for m in request.get("messages") or ()]
    if kind == "inference":
        out = [message_of(response["message"])] if response.get("message") is not None else []
        return inputs, out, None
    calls = request.get("calls") or ([request] if "tool" in request else [])
    call = (ToolCall(name=str(calls[0].get("name", calls[0].get("tool"))), arguments=_json(calls[0].get("arguments", {})))
            if calls else None)
    return [], [message_of(m) for m in response.get("messages") or ()], call


def _key(m: Message) -> tuple[str, str, tuple[ToolCall, ...]]:
    return m.role, m.content, m.tool_calls


def _drop_repeats(inputs: list[Message], seen: list[Message]) -> list[Message]:
    """A gateway request starts with the end of what the transcript shows already (the previous
    answer, and the tool results the MCP tool gateway recorded): show only what follows it."""
    for k in range(min(len(inputs), len(seen)), 0, -1):
        if [_key(m) for m in inputs[:k]] == [_key(m) for m in seen[-k:]]:
            return inputs[k:]
    return inputs


def step_view(row: Any, seen: list[Message]) -> StepView:
    """A step row (ORM object or mapping with the steps columns) as a StepView; `seen` holds the
    messages shown so far in this transcript and is extended."""
    get: Callable[[str], Any] = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    inputs, outputs, call = step_messages(get("kind"), get("request"), get("response"))
    request = get("request") if isinstance(get("request"), dict) else {}
    if request.get("messages_from"):  # a gateway request after the first: only what is new
        inputs = _drop_repeats(inputs, seen)
    seen.extend(inputs + outputs)
    return StepView(
        index=int(get("index")), attempt=int(get("attempt") or 1), kind=str(get("kind")), status=str(get("status")),
        worker=get("worker"), enqueued_at=get("enqueued_at"), started_at=get("started_at"),
        finished_at=get("finished_at"), prompt_tokens=get("prompt_tokens"),
        cached_tokens=get("cached_prompt_tokens"), output_tokens=get("output_tokens"), error=get("error"),
        inputs=inputs, outputs=outputs, call=call)


def _transcript(sample: Sample, steps: list[Step]) -> Transcript:
    seen: list[Message] = []
    views = [step_view(st, seen) for st in sorted(steps, key=lambda s: (s.index, s.attempt, s.id))]
    return Transcript(
        batch_id=sample.batch_id, sample_id=sample.id, index=sample.index, task_id=sample.task_id,
        group=sample.task_group, status=str(sample.status), score=sample.score, result=sample.result,
        error=sample.error, admitted_at=sample.admitted_at, finished_at=sample.finished_at, steps=views)


class UnknownSample(LookupError):
    """No such sample in the batch."""


def load_transcript(store: Store, batch_id: int, sample_id: int) -> Transcript:
    with store.session() as s:
        sample = s.get(Sample, sample_id)
        if sample is None or sample.batch_id != batch_id:
            raise UnknownSample(f"no sample with id {sample_id} in batch {batch_id}")
        steps = list(s.scalars(select(Step).where(Step.sample_id == sample_id)))
        return _transcript(sample, steps)


def sample_id_at(store: Store, batch_id: int, index: int) -> int:
    """The id of the sample at this index of the batch."""
    with store.session() as s:
        sid = s.scalar(select(Sample.id).where(Sample.batch_id == batch_id, Sample.index == index))
    if sid is None:
        raise UnknownSample(f"no sample with index {index} in batch {batch_id}")
    return int(sid)


def iter_transcripts(store: Store, batch_id: int, chunk: int = 200) -> Iterator[Transcript]:
    """Every sample's transcript in index order, reading `chunk` samples' steps at a time."""
    with store.session() as s:
        ids = list(s.scalars(select(Sample.id).where(Sample.batch_id == batch_id).order_by(Sample.index)))
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        with store.session() as s:
            samples = list(s.scalars(select(Sample).where(Sample.id.in_(part)).order_by(Sample.index)))
            by_sample: dict[int, list[Step]] = {sid: [] for sid in part}
            for st in s.scalars(select(Step).where(Step.sample_id.in_(part))):
                by_sample[st.sample_id].append(st)
        # Yielded once the session is closed: the consumer's time between transcripts holds no transaction.
        for sample in samples:
            yield _transcript(sample, by_sample[sample.id])
