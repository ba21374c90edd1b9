"""Export a batch from the store as a trace, and import a trace into the store as a batch.

Export keeps, per sample, the last completed attempt of every step (abandoned and failed attempts
are history, not part of the chain). Times become seconds relative to the batch start. The
conversation is stored once (initial messages + each step's response), as the store does.
Import writes a completed batch whose rows look like a live run's (same request/response shapes),
so analytics, `trace export` and history priors work on it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from agentbatch.db.models import Batch, BatchStatus, Sample, Step, StepStatus
from agentbatch.db.step_records import (
    environment_request,
    environment_response,
    inference_request,
    inference_response,
)
from agentbatch.db.store import Store
from agentbatch.protocols.tokens import chat_tokens, count_tokens, render_message
from agentbatch.traces.conversation import assistant_message, initial_messages, observation_messages
from agentbatch.traces.schema import ENVIRONMENT, INFERENCE, Trace, TraceSample, TraceStep


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else t - t0


def _prefix(messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None) -> tuple[str, int]:
    """Prefix group (hash of tools + leading system messages) and its token count."""
    system = []
    for m in messages or []:
        if m.get("role") != "system":
            break
        system.append(m)
    if not system and not tools:
        return "", 0
    key = json.dumps([tools or [], system], sort_keys=True).encode()
    return hashlib.sha1(key).hexdigest()[:12], len(chat_tokens(system, tools))


def _completed_steps(steps: list[Step]) -> dict[int, dict[int, Step]]:
    """sample id -> step index -> its last completed attempt."""
    by_sample: dict[int, dict[int, Step]] = defaultdict(dict)
    for st in steps:
        if st.status == StepStatus.COMPLETED:
            by_sample[st.sample_id][st.index] = st  # later attempts win (ordered by id)
    return by_sample


def _trace_step(st: Step, t0: float, response: dict[str, Any] | None) -> TraceStep:
    resp = response or {}
    duration = (st.finished_at - st.started_at) if st.finished_at is not None else 0.0
    step = TraceStep(
        index=st.index, kind=st.kind, duration_s=duration, enqueued_at=_rel(st.enqueued_at, t0),
        started_at=_rel(st.started_at, t0), finished_at=_rel(st.finished_at, t0), worker=st.worker,
        prompt_tokens=st.prompt_tokens, cached_prompt_tokens=st.cached_prompt_tokens,
        recomputed_tokens=st.recomputed_tokens, output_tokens=st.output_tokens, prefill_s=st.prefill_s,
        decode_s=st.decode_s, engine_queue_s=st.engine_queue_s, tool_calls=st.tool_calls,
    )  # fmt: skip
    if st.kind == INFERENCE:
        step.message = resp.get("message")
    else:
        step.observation = list(resp.get("messages") or [])
        step.obs_tokens = sum(count_tokens(render_message(m)) for m in step.observation)
        step.done = bool(resp.get("done"))
        step.tools = resp.get("tools")
    return step


def _trace_sample(sm: Sample, recorded: list[Step], t0: float) -> TraceSample:
    first_req = recorded[0].request if recorded and recorded[0].request else {}
    messages, tools = first_req.get("messages"), first_req.get("tools")
    ts = _sample_of(sm, t0, _prefix(messages, tools), tools=tools, messages=messages)
    ts.steps.extend(_trace_step(st, t0, st.response) for st in recorded)
    return ts


def _sample_of(sm: Sample, t0: float, prefix: tuple[str, int], **payload: Any) -> TraceSample:
    """A sample row as a trace sample without its steps; `payload`: its tools and initial messages."""
    return TraceSample(
        index=sm.index, task_id=sm.task_id, task=sm.task or {}, score=sm.score, result=sm.result,
        status=sm.status, admitted_at=_rel(sm.admitted_at, t0), finished_at=_rel(sm.finished_at, t0),
        prefix_group=prefix[0], shared_prefix_tokens=prefix[1], **payload,
    )  # fmt: skip


def export_batch(store: Store, batch_id: int) -> Trace:
    batch = store.get_batch(batch_id)
    if batch is None:
        raise ValueError(f"no batch {batch_id} in the store")
    samples = store.samples(batch_id)
    all_steps = store.steps(batch_id)
    by_sample = _completed_steps(all_steps)
    t0 = batch.started_at or min((st.started_at for st in all_steps), default=batch.created_at)
    out = [_trace_sample(sm, [by_sample[sm.id][i] for i in sorted(by_sample[sm.id])], t0) for sm in samples]
    meta = {"source": "store", "batch_id": batch_id, "batch_name": batch.name, "config": batch.config}
    return Trace(samples=out, meta=meta)


# a step's columns but its payloads (request, response, error)
_LIGHT = tuple(c for c in Step.__table__.columns if c.name not in ("request", "response", "error"))


class RecordReader:
    """A running batch read again and again as a trace without its payloads: what a simulation of it
    needs (each step's timing and token counts, an environment step's observation tokens and whether
    it ended the sample, each sample's shared prefix), as `export_batch` gives it, without the
    messages, observations and tool schemas. A completed step is converted once and kept (its row
    does not change again); a read fetches the payloads of the steps completed since the last read
    only, so a read costs the batch's step rows without their payloads, plus what is new."""

    def __init__(self, store: Store, batch_id: int) -> None:
        self.store, self.batch_id = store, batch_id
        self._t0: float | None = None
        self._steps: dict[int, TraceStep] = {}  # completed step id -> its trace step, payloads dropped
        self._prefix: dict[int, tuple[str, int]] = {}  # sample id -> (prefix group, shared tokens)

    def read(self) -> Trace:
        batch = self.store.get_batch(self.batch_id)
        if batch is None:
            raise ValueError(f"no batch {self.batch_id} in the store")
        with self.store.session() as s:  # rows, not ORM objects: a third of the time for this many
            rows: list[Any] = list(s.execute(select(*_LIGHT).where(Step.batch_id == self.batch_id).order_by(Step.id)))
        t0 = batch.started_at or min((st.started_at for st in rows), default=batch.created_at)
        if t0 != self._t0:
            self._t0, self._steps, self._prefix = t0, {}, {}
        by_sample = _completed_steps(rows)
        self._convert([st for steps in by_sample.values() for st in steps.values() if st.id not in self._steps], t0)
        out = []
        for sm in self.store.samples(self.batch_id):
            ts = _sample_of(sm, t0, self._prefix.get(sm.id, ("", 0)))  # known once its first step completed
            ts.steps.extend(self._steps[by_sample[sm.id][i].id] for i in sorted(by_sample[sm.id]))
            out.append(ts)
        return Trace(samples=out, meta={"source": "store", "batch_id": self.batch_id, "batch_name": batch.name,
                                        "config": batch.config})  # fmt: skip

    def _convert(self, new: list[Any], t0: float) -> None:
        """Convert the newly completed steps (their responses fetched in chunks; the request only of a
        sample's first step, for its prefix), then drop the payloads."""
        for k in range(0, len(new), 500):
            chunk = {st.id: st for st in new[k:k + 500]}
            firsts = [i for i, st in chunk.items() if st.index == 0]
            with self.store.session() as s:
                for step_id, response in s.execute(select(Step.id, Step.response).where(Step.id.in_(list(chunk)))):
                    trace_step = _trace_step(chunk[step_id], t0, response)
                    trace_step.message = trace_step.observation = trace_step.tools = None
                    self._steps[step_id] = trace_step
                for step_id, request in s.execute(select(Step.id, Step.request).where(Step.id.in_(firsts))):
                    first = request or {}
                    self._prefix[chunk[step_id].sample_id] = _prefix(first.get("messages"), first.get("tools"))


@dataclass
class _StepIO:
    """A step's stored request and response, and the conversation after it."""

    request: dict[str, Any]
    response: dict[str, Any]
    messages: list[dict[str, Any]]


def _step_io(ts: TraceSample, st: TraceStep, messages: list[dict[str, Any]]) -> _StepIO:
    """The request/response a live run stores for this step (same shapes as the live step code)."""
    if st.kind == INFERENCE:
        msg = assistant_message(ts, st)
        first = st.index == 0
        request = inference_request(messages, ts.tools, None, messages_from=0 if first else len(messages),
                                    with_tools=first)
        return _StepIO(request, inference_response(msg, "stop"), [*messages, msg])
    obs = observation_messages(ts, st)
    response = environment_response(obs, st.done, tools=st.tools)
    return _StepIO(environment_request(from_step=st.index - 1), response, [*messages, *obs])


def _step_rows(batch_id: int, sample_id: int, ts: TraceSample, base: float) -> list[Step]:
    messages = initial_messages(ts)
    clock = 0.0  # for steps without recorded times: back to back
    rows = []
    for st in ts.steps:
        start = st.started_at if st.started_at is not None else clock
        end = st.finished_at if st.finished_at is not None else start + (st.duration_s or 0.0)
        clock = end
        io = _step_io(ts, st, messages)
        messages = io.messages
        rows.append(
            Step(
                batch_id=batch_id, sample_id=sample_id, index=st.index, kind=st.kind,
                status=StepStatus.COMPLETED, attempt=1,
                enqueued_at=base + (st.enqueued_at if st.enqueued_at is not None else start),
                started_at=base + start, finished_at=base + end, worker=st.worker,
                prompt_tokens=st.prompt_tokens, cached_prompt_tokens=st.cached_prompt_tokens,
                recomputed_tokens=st.recomputed_tokens, output_tokens=st.output_tokens,
                prefill_s=st.prefill_s, decode_s=st.decode_s, engine_queue_s=st.engine_queue_s,
                tool_calls=st.tool_calls if st.kind == ENVIRONMENT else None,
                request=io.request, response=io.response,
            )
        )  # fmt: skip
    return rows


def _sample_row(batch_id: int, ts: TraceSample, base: float) -> Sample:
    return Sample(
        batch_id=batch_id, index=ts.index, task_id=ts.task_id, task=ts.task, status=ts.status,
        steps_done=len(ts.steps), score=ts.score, result=ts.result,
        admitted_at=None if ts.admitted_at is None else base + ts.admitted_at,
        finished_at=None if ts.finished_at is None else base + ts.finished_at,
        last_worker=next((st.worker for st in reversed(ts.steps) if st.kind == INFERENCE), None),
    )  # fmt: skip


def import_trace(store: Store, trace: Trace, name: str | None = None, base_time: float | None = None) -> int:
    """Write the trace as a completed batch; returns its id. Times are base_time (default: now) +
    the recorded relative times."""
    base = time.time() if base_time is None else base_time
    name = name or f"import:{trace.meta.get('family') or trace.meta.get('batch_name') or 'trace'}"
    config = {"imported_trace": trace.meta}
    with store.session() as s, s.begin():
        finished = [x.finished_at for x in trace.samples if x.finished_at is not None]
        batch = Batch(
            name=name, config=json.loads(json.dumps(config, default=str)), status=BatchStatus.COMPLETED,
            created_at=base, started_at=base, finished_at=base + max(finished, default=0.0),
        )  # fmt: skip
        s.add(batch)
        s.flush()
        for ts in trace.samples:
            sm = _sample_row(batch.id, ts, base)
            s.add(sm)
            s.flush()
            s.add_all(_step_rows(batch.id, sm.id, ts, base))
        return batch.id
