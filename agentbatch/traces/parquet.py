"""Trace <-> Parquet file (one table; a row per sample and a row per step; schema in docs/traces.md).

Row kinds (`row` column): "sample" rows carry the sample-level fields (step = -1), "step" rows one
recorded step each. JSON-valued fields are stored as JSON text. The trace `meta` and the format
version live in the Parquet key-value metadata under b"agentbatch.trace".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentbatch.traces.schema import TRACE_VERSION, Trace, TraceSample, TraceStep

META_KEY = b"agentbatch.trace"

SCHEMA = pa.schema(
    [
        ("row", pa.string()),
        ("sample", pa.int32()),
        ("task_id", pa.string()),
        ("step", pa.int32()),
        ("kind", pa.string()),
        ("duration_s", pa.float64()),
        ("enqueued_at", pa.float64()),
        ("started_at", pa.float64()),
        ("finished_at", pa.float64()),
        ("worker", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("cached_prompt_tokens", pa.int32()),
        ("recomputed_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("prefill_s", pa.float64()),
        ("decode_s", pa.float64()),
        ("engine_queue_s", pa.float64()),
        ("obs_tokens", pa.int32()),
        ("tool_calls", pa.int32()),
        ("done", pa.bool_()),
        ("message_json", pa.string()),
        ("observation_json", pa.string()),
        ("request_messages_json", pa.string()),
        ("step_tools_json", pa.string()),
        # sample rows
        ("status", pa.string()),
        ("score", pa.float64()),
        ("result_json", pa.string()),
        ("task_json", pa.string()),
        ("tools_json", pa.string()),
        ("messages_json", pa.string()),
        ("admitted_at", pa.float64()),
        ("sample_finished_at", pa.float64()),
        ("prefix_group", pa.string()),
        ("shared_prefix_tokens", pa.int32()),
    ]
)

_STEP_PLAIN = (
    "duration_s", "enqueued_at", "started_at", "finished_at", "worker", "prompt_tokens",
    "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s", "decode_s",
    "engine_queue_s", "obs_tokens", "tool_calls",
)  # fmt: skip


def _dumps(v: Any) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)


def _loads(v: str | None) -> Any:
    return None if v is None else json.loads(v)


def trace_to_table(trace: Trace) -> pa.Table:
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    names = list(cols)

    def add(values: dict[str, Any]) -> None:
        for n in names:
            cols[n].append(values.get(n))

    for s in trace.samples:
        add(
            {
                "row": "sample", "sample": s.index, "task_id": s.task_id, "step": -1,
                "status": s.status, "score": s.score, "result_json": _dumps(s.result),
                "task_json": _dumps(s.task), "tools_json": _dumps(s.tools),
                "messages_json": _dumps(s.messages), "admitted_at": s.admitted_at,
                "sample_finished_at": s.finished_at, "prefix_group": s.prefix_group,
                "shared_prefix_tokens": s.shared_prefix_tokens,
            }
        )  # fmt: skip
        for st in s.steps:
            row = {n: getattr(st, n) for n in _STEP_PLAIN}
            row.update(
                row="step", sample=s.index, task_id=s.task_id, step=st.index, kind=st.kind, done=st.done,
                message_json=_dumps(st.message), observation_json=_dumps(st.observation),
                request_messages_json=_dumps(st.request_messages), step_tools_json=_dumps(st.tools),
            )  # fmt: skip
            add(row)
    meta = {"version": TRACE_VERSION, "meta": trace.meta}
    return pa.Table.from_pydict(cols, schema=SCHEMA).replace_schema_metadata({META_KEY: json.dumps(meta)})


def _sample_from_row(cols: dict[str, list[Any]], i: int) -> TraceSample:
    return TraceSample(
        index=cols["sample"][i],
        task_id=cols["task_id"][i],
        task=_loads(cols["task_json"][i]) or {},
        score=cols["score"][i],
        result=_loads(cols["result_json"][i]),
        status=cols["status"][i] or "completed",
        admitted_at=cols["admitted_at"][i],
        finished_at=cols["sample_finished_at"][i],
        tools=_loads(cols["tools_json"][i]),
        messages=_loads(cols["messages_json"][i]),
        prefix_group=cols["prefix_group"][i] or "",
        shared_prefix_tokens=cols["shared_prefix_tokens"][i] or 0,
    )


def _step_from_row(cols: dict[str, list[Any]], i: int) -> TraceStep:
    st = TraceStep(index=cols["step"][i], kind=cols["kind"][i], duration_s=cols["duration_s"][i])
    for n in _STEP_PLAIN[1:]:
        setattr(st, n, cols[n][i])
    st.done = bool(cols["done"][i])
    st.message = _loads(cols["message_json"][i])
    st.observation = _loads(cols["observation_json"][i])
    st.request_messages = _loads(cols["request_messages_json"][i])
    st.tools = _loads(cols["step_tools_json"][i]) if "step_tools_json" in cols else None  # older traces
    return st


def _header(table: pa.Table) -> dict[str, Any]:
    raw = (table.schema.metadata or {}).get(META_KEY)
    header: dict[str, Any] = json.loads(raw) if raw else {"version": TRACE_VERSION, "meta": {}}
    if header.get("version", TRACE_VERSION) > TRACE_VERSION:
        raise ValueError(f"trace format version {header['version']} is newer than this agentbatch ({TRACE_VERSION})")
    return header


def table_to_trace(table: pa.Table) -> Trace:
    header = _header(table)
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    samples: dict[int, TraceSample] = {}
    steps: list[tuple[int, TraceStep]] = []
    for i in range(table.num_rows):
        if cols["row"][i] == "sample":
            samples[cols["sample"][i]] = _sample_from_row(cols, i)
        else:
            steps.append((cols["sample"][i], _step_from_row(cols, i)))
    for idx, st in steps:
        samples[idx].steps.append(st)
    for s in samples.values():
        s.steps.sort(key=lambda st: st.index)
    return Trace(samples=[samples[k] for k in sorted(samples)], meta=header.get("meta", {}))


def write_trace(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(trace_to_table(trace), path, compression="zstd")
    return path


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    return table_to_trace(pq.read_table(path))
