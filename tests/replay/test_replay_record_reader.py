"""`RecordReader`: a running batch read again and again as a trace without payloads (what live
re-planning simulates at each checkpoint) is `export_batch`'s trace with the payloads dropped, at
every read, while steps complete between reads."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import update

from agentbatch.db.models import Step, StepStatus
from agentbatch.db.store import Store
from agentbatch.db.trace_io import RecordReader, export_batch, import_trace
from agentbatch.traces import Trace, generate


def _lean(trace: Trace) -> list:
    """The trace as a simulation reads it: no messages, observations or tool schemas."""
    return [replace(s, tools=None, messages=None,
                    steps=[replace(st, message=None, observation=None, tools=None) for st in s.steps])
            for s in trace.samples]  # fmt: skip


def _set_status(store: Store, ids: list[int], status: str) -> None:
    with store.session() as s, s.begin():
        s.execute(update(Step).where(Step.id.in_(ids)).values(status=status))


def test_each_read_is_the_export_without_payloads_while_steps_complete(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    batch_id = import_trace(store, generate("mcp_like", 6, seed=3), base_time=1000.0)
    steps = store.steps(batch_id)
    late = [st.id for st in steps if st.index >= 3]  # not yet completed at the first read
    _set_status(store, late, StepStatus.RUNNING)
    reader = RecordReader(store, batch_id)
    first = reader.read()
    assert _lean(first) == _lean(export_batch(store, batch_id))
    assert all(len(s.steps) == min(3, len(t.steps)) for s, t in zip(first.samples, generate("mcp_like", 6, seed=3).samples,
                                                                     strict=True))  # fmt: skip
    assert all(st.observation is None and st.message is None for s in first.samples for st in s.steps)
    assert any(s.shared_prefix_tokens for s in first.samples) and any(st.obs_tokens for s in first.samples for st in s.steps)
    _set_status(store, late[: len(late) // 2], StepStatus.COMPLETED)
    assert _lean(reader.read()) == _lean(export_batch(store, batch_id))
    _set_status(store, late, StepStatus.COMPLETED)
    whole = reader.read()
    assert _lean(whole) == _lean(export_batch(store, batch_id))
    assert sum(len(s.steps) for s in whole.samples) == len(steps)
