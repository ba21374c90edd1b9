"""The SQL store on SQLite and PostgreSQL: batches, samples, step attempts, atomic completion."""

from __future__ import annotations

import pytest

from agentbatch.db.models import SampleStatus, StepStatus
from agentbatch.db.store import StepOutcome, Store


def new_batch(store: Store) -> tuple[int, list[int]]:
    bid = store.create_batch("b", {"k": [1, 2]}, [("t1", {"a": 1}), ("t2", {}), ("t3", {})])
    return bid, [s.id for s in store.samples(bid)]


def start(store: Store, bid: int, sid: int, index: int, kind: str = "inference") -> int:
    return store.start_step(batch_id=bid, sample_id=sid, index=index, kind=kind, enqueued_at=1.0,
                            request={"n": index}, worker="w0")


def test_batch_and_samples(store: Store) -> None:
    bid, sids = new_batch(store)
    batch = store.get_batch(bid)
    assert batch.config == {"k": [1, 2]} and batch.status == "pending"
    assert [s.task_id for s in store.samples(bid)] == ["t1", "t2", "t3"]
    store.admit_sample(sids[0])
    store.finish_sample(sids[1], score=None, result=None, error="boom")
    assert store.status_counts(bid) == {"running": 1, "failed": 1, "pending": 1}
    assert [s.task_id for s in store.samples(bid, statuses=[SampleStatus.PENDING])] == ["t3"]


def test_step_completion_advances_sample(store: Store) -> None:
    bid, sids = new_batch(store)
    step = start(store, bid, sids[0], 0)
    store.complete_step(step, StepOutcome(response={"message": {"role": "assistant"}}, prompt_tokens=10,
                                          cached_prompt_tokens=4, output_tokens=3, worker="w1"))
    [done] = store.completed_steps(sids[0])
    assert (done.prompt_tokens, done.cached_prompt_tokens, done.output_tokens) == (10, 4, 3)
    sample = store.samples(bid)[0]
    assert sample.steps_done == 1 and sample.last_worker == "w1"
    with pytest.raises(RuntimeError):
        store.complete_step(step, StepOutcome(response={}))  # completed once only


def test_completion_is_atomic(store: Store) -> None:
    """If the completing transaction fails, neither the step nor the sample changes."""
    bid, sids = new_batch(store)
    step = start(store, bid, sids[0], 0)
    with pytest.raises(Exception):  # noqa: B017 - the driver's error type differs per database
        store.complete_step(step, StepOutcome(response={"not json": object()}))
    assert store.completed_steps(sids[0]) == []
    assert store.samples(bid)[0].steps_done == 0
    assert [s.status for s in store.steps(bid)] == [StepStatus.RUNNING]


def test_attempts_and_abandon(store: Store) -> None:
    bid, sids = new_batch(store)
    first = start(store, bid, sids[0], 0)
    store.fail_step(first, "engine down")
    second = start(store, bid, sids[0], 0)
    third = start(store, bid, sids[1], 0)
    assert store.abandon_running(bid) == 2
    retry = start(store, bid, sids[0], 0)
    attempts = [(s.id, s.attempt, s.status) for s in store.steps(bid) if s.sample_id == sids[0]]
    assert attempts == [(first, 1, "failed"), (second, 2, "abandoned"), (retry, 3, "running")]
    assert [s.status for s in store.steps(bid) if s.id == third] == ["abandoned"]


def test_prior_chain_lengths_from_earlier_batches(store: Store) -> None:
    old, old_sids = new_batch(store)
    for sid, steps in zip(old_sids, (4, 6), strict=False):
        for i in range(steps):
            store.complete_step(start(store, old, sid, i), StepOutcome(response={}))
        store.finish_sample(sid, score=1.0, result={})
    new, _ = new_batch(store)
    assert store.prior_chain_lengths(["t1", "t2", "t3"], exclude_batch_id=new) == {"t1": 4.0, "t2": 6.0}
    assert store.prior_chain_lengths(["t1"], exclude_batch_id=old) == {}


def test_workers(store: Store) -> None:
    bid, _ = new_batch(store)
    store.upsert_worker(bid, "w0", "engine", endpoint="http://x", settings={"max_num_seqs": 8})
    store.upsert_worker(bid, "w0", "engine", metrics={"hits": 3})
    with store.session() as s:
        from agentbatch.db.models import Worker

        [w] = s.query(Worker).all()
        assert (w.endpoint, w.settings, w.metrics) == ("http://x", {"max_num_seqs": 8}, {"hits": 3})
