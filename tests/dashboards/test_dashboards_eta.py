"""Live ETA on a half-done batch with hand-set timings (times relative to T0 = 1000 s, now = T0 + 20).

Earlier batch: task z completed in 10 steps.
This batch: a (task x) done, 4 steps at 2.5 s each; b (task y) done, 4 steps at 2 s; c (task z)
admitted at 10, 1 step done at 12, one running; d (task w) pending.
Expected chains: z 10 (history) -> 9 left; w unknown -> this batch's mean 4 -> 4 left; 13 steps.
Rate 9 steps / 20 s = 0.45/s -> 28.9 s; chain term 9 x mean(2.5, 2, 2) = 19.5 s; ETA 28.9 s.
"""

from __future__ import annotations

import pytest
from dashboards_batches import T0, write_batch

from agentbatch.dashboards.eta import estimate_eta
from agentbatch.db.store import UnknownBatch


def _steps(n: int, start: float, each: float, running: bool = False) -> list[dict]:
    out = [dict(index=i, kind="inference" if i % 2 == 0 else "environment", enq=start + i * each,
                start=start + i * each, fin=start + (i + 1) * each) for i in range(n)]
    if running:
        out.append(dict(index=n, kind="inference", enq=start + n * each, start=start + n * each, fin=None,
                        status="running"))
    return out


def test_eta_from_history_and_this_batch(store):
    write_batch(store, [dict(task_id="z", admitted=T0 - 500, finished=T0 - 400, status="completed", score=1.0,
                             steps=_steps(10, T0 - 500, 10.0))], name="earlier")
    bid = write_batch(store, [
        dict(task_id="x", admitted=T0, finished=T0 + 10, status="completed", score=1.0, steps=_steps(4, T0, 2.5)),
        dict(task_id="y", admitted=T0, finished=T0 + 8, status="completed", score=1.0, steps=_steps(4, T0, 2.0)),
        dict(task_id="z", admitted=T0 + 10, finished=None, status="running",
             steps=_steps(1, T0 + 10, 2.0, running=True)),
        dict(task_id="w", admitted=None, finished=None, status="pending", steps=[]),
    ], status="running")
    eta = estimate_eta(store, bid, now=T0 + 20)
    assert (eta.total, eta.done, eta.steps_done, eta.steps_running) == (4, 2, 9, 1)
    assert eta.counts == {"completed": 2, "running": 1, "pending": 1}
    assert eta.tasks_with_history == 1
    assert eta.remaining_steps == pytest.approx(13.0)
    assert eta.step_rate == pytest.approx(0.45)
    assert eta.step_s_per_sample == pytest.approx((2.5 + 2 + 2) / 3)
    assert eta.remaining_s == pytest.approx(13 / 0.45)
    assert "earlier batches" in eta.basis
    assert "ETA" in eta.to_text() and "2/4 done" in eta.to_text()


def test_eta_chain_term_dominates(store):
    # One long task known to take 50 steps; 5 done in 10 s, nothing else left: throughput term
    # 45 / 0.5 = 90 s, chain term 45 x 2 s = 90 s -> equal; add a finished short sample to raise the rate.
    write_batch(store, [dict(task_id="long", admitted=T0 - 900, finished=T0 - 800, status="completed",
                             steps=_steps(50, T0 - 900, 2.0))], name="earlier")
    bid = write_batch(store, [
        dict(task_id="long", admitted=T0, finished=None, status="running", steps=_steps(5, T0, 2.0)),
        dict(task_id="short", admitted=T0, finished=T0 + 10, status="completed", steps=_steps(20, T0, 0.5)),
    ], status="running")
    eta = estimate_eta(store, bid, now=T0 + 10)
    # rate 25 / 10 = 2.5 steps/s -> 18 s; chain: 45 left x mean(2.0, 0.5) = 56.25 s
    assert eta.remaining_s == pytest.approx(45 * 1.25)


def test_eta_finished_and_nothing_started(store):
    done = write_batch(store, [dict(task_id="a", admitted=T0, finished=T0 + 3, status="completed",
                                    steps=_steps(2, T0, 1.5))])
    eta = estimate_eta(store, done)
    assert eta.remaining_s == 0 and eta.elapsed_s == pytest.approx(3.0)
    fresh = write_batch(store, [dict(task_id="q", admitted=None, finished=None, status="pending")], status="pending")
    eta = estimate_eta(store, fresh, now=T0)
    assert eta.remaining_s is None and "unknown" in eta.to_text()


def test_eta_unknown_batch(store):
    with pytest.raises(UnknownBatch):
        estimate_eta(store, 424242)
