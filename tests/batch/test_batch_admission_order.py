"""With history in the store, samples are admitted longest recorded chain first."""

from __future__ import annotations

import asyncio

from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, execute_batch
from agentbatch.flows.config import BatchConfig


def cfg(order: str) -> BatchConfig:
    return BatchConfig.model_validate({
        "workload": {"kind": "bfcl", "params": {"limit": 6, "seed": 4}},
        "engine": {"kind": "scripted", "params": {"timing": {"kind": "token", "scale": 0}}},
        "scheduling": {"max_active_samples": 1, "admission_order": order},
    })


def admission_order(store: Store, batch_id: int) -> list[str]:
    return [s.task_id for s in sorted(store.samples(batch_id), key=lambda s: s.admitted_at)]


def test_longest_prior_first(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    first = create_batch(cfg("longest_prior_first"), store)
    asyncio.run(execute_batch(store, first, use_prefect=False, show_progress=False))
    assert admission_order(store, first) == [s.task_id for s in store.samples(first)]  # no history: as listed
    lengths = {s.task_id: s.steps_done for s in store.samples(first)}
    assert len(set(lengths.values())) > 1

    second = create_batch(cfg("longest_prior_first"), store)
    asyncio.run(execute_batch(store, second, use_prefect=False, show_progress=False))
    order = admission_order(store, second)
    assert [lengths[t] for t in order] == sorted(lengths.values(), reverse=True)

    third = create_batch(cfg("arrival"), store)
    asyncio.run(execute_batch(store, third, use_prefect=False, show_progress=False))
    assert admission_order(store, third) == [s.task_id for s in store.samples(third)]
    store.close()


def test_longest_tail_first(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    first = create_batch(cfg("longest_tail_first"), store)
    asyncio.run(execute_batch(store, first, use_prefect=False, show_progress=False))
    listed = [s.task_id for s in store.samples(first)]
    assert admission_order(store, first) == listed  # no history: as listed
    lengths = {s.task_id: s.steps_done for s in store.samples(first)}
    longest = max(listed, key=lambda t: (lengths[t], -listed.index(t)))

    second = create_batch(cfg("longest_tail_first"), store)
    asyncio.run(execute_batch(store, second, use_prefect=False, show_progress=False))
    # a tenth of 6 samples rounds to the one longest; the other five follow as listed
    assert admission_order(store, second) == [longest] + [t for t in listed if t != longest]
    assert admission_order(store, second) != sorted(listed, key=lambda t: -lengths[t])  # not full LPT
    store.close()


def test_kv_balanced_live_says_it_orders_longest_first(sqlite_url: str, caplog) -> None:
    """A live batch has no context priors or KV capacity for kv_balanced: it says so in the log and
    admits longest recorded chain first."""
    store = Store(sqlite_url)
    first = create_batch(cfg("arrival"), store)
    asyncio.run(execute_batch(store, first, use_prefect=False, show_progress=False))
    lengths = {s.task_id: s.steps_done for s in store.samples(first)}
    second = create_batch(cfg("kv_balanced"), store)
    with caplog.at_level("WARNING", logger="agentbatch.batch"):
        asyncio.run(execute_batch(store, second, use_prefect=False, show_progress=False))
    assert any("kv_balanced" in r.getMessage() and "longest" in r.getMessage() for r in caplog.records)
    assert [lengths[t] for t in admission_order(store, second)] == sorted(lengths.values(), reverse=True)
    store.close()


def test_the_claim_window_starts_with_the_head_of_the_admission_order(sqlite_url: str) -> None:
    """`run` holds a window of samples (16 here) and claims more as they finish; its first claim
    comes before the admission plan. The order still holds over the whole batch: the window starts
    with the longest recorded chains wherever they are listed, as virtual time admits them."""
    def big(order: str) -> BatchConfig:
        return cfg(order).model_copy(update={"workload": cfg(order).workload.model_copy(
            update={"params": {"limit": 40, "seed": 4}})})  # fmt: skip

    store = Store(sqlite_url)
    first = create_batch(big("arrival"), store)
    asyncio.run(execute_batch(store, first, use_prefect=False, show_progress=False))
    listed = [s.task_id for s in store.samples(first)]
    lengths = {s.task_id: s.steps_done for s in store.samples(first)}
    top = sorted(listed, key=lambda t: -lengths[t])[:16]
    assert any(listed.index(t) >= 16 for t in top)  # some of the longest are listed past the first window

    second = create_batch(big("longest_prior_first"), store)
    asyncio.run(execute_batch(store, second, use_prefect=False, show_progress=False))
    assert [lengths[t] for t in admission_order(store, second)] == sorted(lengths.values(), reverse=True)
    assert all(s.lease_owner is None for s in store.samples(second))  # given back or finished: none held
    store.close()
