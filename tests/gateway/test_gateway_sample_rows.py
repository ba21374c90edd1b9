"""The rows a gateway writes for the samples it sees (`db/gateway_records.py`, `gateway/samples.py:_create`),
applied as the writer applies them, on SQLite and PostgreSQL: appended with the next index in the
batch, the prior chain length read from earlier batches in the same transaction, admitted (the first
admission time kept), ended with a score and result that a later end without them keeps."""

from __future__ import annotations

from agentbatch.db import gateway_records as records
from agentbatch.db.step_records import SampleRef
from agentbatch.db.store import Store
from agentbatch.gateway.samples import GatewaySample, _create
from agentbatch.scheduling.types import SampleProgress


def apply(store: Store, job, *args, **kwargs) -> object:  # noqa: ANN001 - a writer job
    with store.session() as s, s.begin():
        return job(s, *args, **kwargs)


def gateway_sample(key: str, seq: int) -> GatewaySample:
    return GatewaySample(key=key, row=SampleRef(), progress=SampleProgress(sample_id=seq, task_id=key, arrival_seq=seq))


def test_sample_rows_appended_admitted_and_ended(store: Store) -> None:
    earlier = store.create_batch("earlier", {}, [("task-a", {}), ("task-a", {})])
    for sample, steps in zip(store.samples(earlier), (4, 8), strict=True):
        apply(store, records.admit_sample_at, SampleRef(sample.id), 1.0)
        with store.session() as s, s.begin():
            s.get_one(type(sample), sample.id).steps_done = steps
        apply(store, records.end_sample, SampleRef(sample.id), 2.0, score=None, result=None)
    bid = store.create_batch("gw", {}, [])
    a, b = gateway_sample("task-a", 0), gateway_sample("task-b", 1)
    apply(store, _create, bid, a)
    apply(store, _create, bid, b)
    assert (a.progress.prior_chain_steps, b.progress.prior_chain_steps) == (6.0, None)
    rows = {s.task_id: s for s in store.samples(bid)}
    assert (rows["task-a"].id, rows["task-a"].index, rows["task-b"].index) == (a.row.id, 0, 1)
    assert rows["task-a"].status == "pending" and rows["task-a"].task == {"gateway": True}

    apply(store, records.admit_sample_at, a.row, 10.0)
    apply(store, records.end_sample, a.row, 20.0, score=0.5, result={"ended": "finish", "answer": 42})
    apply(store, records.admit_sample_at, a.row, 30.0)  # runs again: the first admission is kept
    [row] = [s for s in store.samples(bid) if s.id == a.row.id]
    assert (row.status, row.admitted_at, row.finished_at) == ("running", 10.0, None)
    apply(store, records.end_sample, a.row, 40.0, score=None, result={"ended": "idle"})
    apply(store, records.end_sample, b.row, 41.0, score=None, result=None, error="never admitted")
    rows = {s.task_id: s for s in store.samples(bid)}
    assert (rows["task-a"].status, rows["task-a"].finished_at, rows["task-a"].score) == ("completed", 40.0, 0.5)
    assert rows["task-a"].result == {"ended": "idle", "answer": 42}
    assert (rows["task-b"].status, rows["task-b"].error, rows["task-b"].result) == ("failed", "never admitted", None)
