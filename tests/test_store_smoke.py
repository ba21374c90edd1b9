from agentbatch.db.store import StepOutcome, Store


def test_store_roundtrip(store: Store) -> None:
    bid = store.create_batch("b", {"x": 1}, [("t1", {"a": 1}), ("t2", {})])
    s1, s2 = store.samples(bid)
    sid = store.start_step(batch_id=bid, sample_id=s1.id, index=0, kind="inference", enqueued_at=0.0, request={})
    store.complete_step(sid, StepOutcome(response={"ok": True}, prompt_tokens=5, worker="w0"))
    assert store.samples(bid)[0].steps_done == 1
    assert store.samples(bid)[0].last_worker == "w0"
    assert store.status_counts(bid) == {"pending": 2}
