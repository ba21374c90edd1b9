"""The SQL store on SQLite and PostgreSQL: batches, samples, step attempts (written by the one step
writer, as every driver writes them), atomic completion, attempts and abandon."""

from __future__ import annotations

import pytest
from testkit import commit_writes

from agentbatch.db.models import SampleStatus, StepStatus
from agentbatch.db.step_records import StepAttempt, StepOutcome, sample_update
from agentbatch.db.store import Store


def new_batch(store: Store) -> tuple[int, list[int]]:
    bid = store.create_batch("b", {"k": [1, 2]}, [("t1", {"a": 1}), ("t2", {}), ("t3", {})])
    return bid, [s.id for s in store.samples(bid)]


def attempt(bid: int, sid: int, index: int, number: int = 1, kind: str = "inference") -> StepAttempt:
    return StepAttempt(batch_id=bid, sample=sid, index=index, attempt=number, kind=kind, enqueued_at=1.0,
                       started_at=2.0, worker="w0", request={"n": index})


def test_batch_and_samples(store: Store) -> None:
    bid, sids = new_batch(store)
    batch = store.get_batch(bid)
    assert batch.config == {"k": [1, 2]} and batch.status == "pending"
    assert [s.task_id for s in store.samples(bid)] == ["t1", "t2", "t3"]
    commit_writes(store, [sample_update(sids[0], {"status": SampleStatus.RUNNING, "admitted_at": 5.0})])
    store.finish_sample(sids[1], score=None, result=None, error="boom")
    assert store.status_counts(bid) == {"running": 1, "failed": 1, "pending": 1}
    assert [s.task_id for s in store.samples(bid, statuses=[SampleStatus.PENDING])] == ["t3"]


def test_step_completion_advances_sample(store: Store) -> None:
    bid, sids = new_batch(store)
    step = attempt(bid, sids[0], 0)
    commit_writes(store, [step.begun(), step.completed(
        StepOutcome(response={"message": {"role": "assistant"}}, prompt_tokens=10, cached_prompt_tokens=4,
                    output_tokens=3, worker="w1"), steps_done=1)])
    [done] = store.completed_steps(sids[0])
    assert (done.prompt_tokens, done.cached_prompt_tokens, done.output_tokens) == (10, 4, 3)
    assert (done.worker, done.request, done.attempt) == ("w1", {"n": 0}, 1)
    sample = store.samples(bid)[0]
    assert sample.steps_done == 1 and sample.last_worker == "w1"
    with pytest.raises(Exception):  # noqa: B017 - one completed attempt per step (unique index), any driver
        commit_writes(store, [attempt(bid, sids[0], 0, 2).completed(StepOutcome(response={}), steps_done=1)])


def test_completion_is_atomic(store: Store) -> None:
    """If the completing transaction fails, neither the step nor the sample changes."""
    bid, sids = new_batch(store)
    step = attempt(bid, sids[0], 0)
    with pytest.raises(Exception):  # noqa: B017 - the driver's error type differs per database
        commit_writes(store, [step.completed(StepOutcome(response={"not json": object()}), steps_done=1)])
    assert store.completed_steps(sids[0]) == []
    assert store.samples(bid)[0].steps_done == 0
    assert store.steps(bid) == []


def test_attempts_and_abandon(store: Store) -> None:
    """Failed attempts stay as history; an attempt whose process died (its `running` row) is marked
    abandoned, and the next attempt is numbered after every earlier one."""
    bid, sids = new_batch(store)
    first, second, other = attempt(bid, sids[0], 0), attempt(bid, sids[0], 0, 2), attempt(bid, sids[1], 0)
    # committed begins (as an external environment's step is) stand for attempts still running
    commit_writes(store, [first.begun(), first.failed("engine down"), second.begun({"in_flight_step": 0}),
                          other.begun({"in_flight_step": 0})])
    assert store.abandon_running(bid) == 2
    assert store.step_history(sids[0]).attempts == {0: 2}
    third = attempt(bid, sids[0], 0, store.step_history(sids[0]).attempts[0] + 1)
    commit_writes(store, [third.begun({"in_flight_step": 0})])
    attempts = [(s.attempt, s.status) for s in store.steps(bid) if s.sample_id == sids[0]]
    assert attempts == [(1, "failed"), (2, "abandoned"), (3, "running")]
    assert [s.status for s in store.steps(bid) if s.sample_id == sids[1]] == [StepStatus.ABANDONED]


def test_prior_chain_lengths_from_earlier_batches(store: Store) -> None:
    old, old_sids = new_batch(store)
    writes = []
    for sid, steps in zip(old_sids, (4, 6), strict=False):
        writes += [attempt(old, sid, i).completed(StepOutcome(response={}), steps_done=i + 1) for i in range(steps)]
    commit_writes(store, writes)
    for sid in old_sids[:2]:
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


def test_workers_registering_the_same_name_at_once_make_one_row(store: Store) -> None:
    """Two `join` processes of one batch register the same engine worker at the same moment: neither
    fails on the other's insert (the row is read, found missing, then inserted by both)."""
    import threading

    from agentbatch.db.models import Worker

    bid, _ = new_batch(store)
    threads_n, rounds = 4, 12
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def register(i: int) -> None:
        for r in range(rounds):
            barrier.wait()
            try:
                store.upsert_worker(bid, f"w{r}", "engine", metrics={"by": i})
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store.session() as s:
        names = sorted(w.name for w in s.query(Worker).filter_by(batch_id=bid))
    assert names == sorted(f"w{r}" for r in range(rounds))
