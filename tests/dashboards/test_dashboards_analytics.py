"""Analytics on a batch whose figures are worked out by hand (times relative to T0 = 1000 s).

Config: 2 engine workers (w0, w1), per_worker_inflight 2, env_slots 2.
  sample t0: inf w0 [0,3] (engine queue .5, prefill 1, decode 1.5); env enq 3.5 [4,6]; inf w0 [6,8]
             (prefill .5, decode 1.5); finished 8.5.  chain = 2.5 + 2 + 2 = 6.5
  sample t1: inf w1 enq 0 [1,4] (prefill 1, decode 2); env attempt 1 [4,5] failed; env attempt 2
             enq 5 [6,9]; inf w1 [9,11] (prefill .5, decode 1.5); finished 12.  chain = 3 + 3 + 2 = 8
  sample t2: admitted 2; inf w0 [2,4]; env enq 4 [5,11]; inf w0 [11,13]; finished 14.  chain = 10
  sample t3: inf w1 [0,1] (prefill .2, decode .8); finished 1.  chain = 1
Makespan 14. LB: chain 10; inference (4.2 prefill + 10.3 decode) / 2 per worker / 2 workers = 3.625;
environment 11 / 2 slots = 5.5 -> LB 10 (chain), ratio 1.4.
"""

from __future__ import annotations

import pytest
from dashboards_batches import T0, write_batch

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.summary import summarize
from agentbatch.db.store import UnknownBatch


def _analysis(store, batch_id) -> BatchAnalysis:
    return BatchAnalysis(load_batch(store, batch_id))


def test_makespan_lower_bound_and_ratio(store, known_batch):
    a = _analysis(store, known_batch(store))
    assert a.t0 == T0
    assert a.makespan_s == pytest.approx(14.0)
    lb = a.lower_bound
    assert lb.longest_chain_s == pytest.approx(10.0)
    assert lb.inference_bound_s == pytest.approx(3.625)
    assert lb.environment_bound_s == pytest.approx(5.5)
    assert lb.binding == "chain"
    assert a.lb_ratio == pytest.approx(1.4)
    assert a.capacity.engine_workers == 2 and a.capacity.env_slots == 2


def test_phases_add_up_to_sample_latency(store, known_batch):
    a = _analysis(store, known_batch(store))
    assert a.phases == pytest.approx({
        "inference_queue": 1.5, "prefill": 4.2, "decode": 10.3, "environment_queue": 2.5,
        "environment_exec": 11.0, "retries": 1.0, "orchestration": 3.0,
    })
    assert sum(a.phases.values()) == pytest.approx(8.5 + 12 + 12 + 1)
    ps = a.per_sample.set_index("task_id")
    assert ps.loc["t1", "retries"] == pytest.approx(1.0)
    assert ps.loc["t0", "orchestration"] == pytest.approx(1.0)
    assert list(ps["chain_s"]) == pytest.approx([6.5, 8.0, 10.0, 1.0])


def test_tail_latency_cache(store, known_batch):
    a = _analysis(store, known_batch(store))
    # finish times 1, 8.5, 12, 14: half done at 8.5, three quarters at 12, 90 % (ceil 3.6 = 4th) at 14.
    assert a.tail_s(0.5) == pytest.approx(5.5)
    assert a.tail_s(0.75) == pytest.approx(2.0)
    assert a.tail_s(0.9) == pytest.approx(0.0)
    assert list(a.latency) == pytest.approx([1.0, 8.5, 12.0, 12.0])
    assert a.cache_hit_rate == pytest.approx(450 / 1050)
    assert a.tokens["recomputed"] == 50
    assert a.score_mean == pytest.approx(0.75)


def test_utilisation_curves(store, known_batch):
    a = _analysis(store, known_batch(store))
    env = a.env_curve.set_index("t")["level"]
    # env attempts: [4,6] [4,5] [6,9] [5,11]  -> 2 busy at 4, 2 at 5, 2 at 6, 1 from 9, 0 from 11
    assert env.to_dict() == {T0 + 4: 2, T0 + 5: 2, T0 + 6: 2, T0 + 9: 1, T0 + 11: 0}
    assert a.env_utilisation == pytest.approx(12 / 14 / 2)
    assert a.worker_utilisation == pytest.approx({"w0": 9 / 14 / 2, "w1": 6 / 14 / 2})
    assert a.mean_active == pytest.approx(33.5 / 14)
    w0 = a.worker_curves["w0"].set_index("t")["level"]
    assert w0[T0 + 2] == 2 and w0[T0 + 3] == 1


def test_critical_samples(store, known_batch):
    a = _analysis(store, known_batch(store))
    crit = a.critical_samples(2)
    assert [c.task_id for c in crit] == ["t2", "t1"]
    assert crit[0].finished_s == pytest.approx(14.0)
    assert crit[0].waits["admission"] == pytest.approx(2.0)
    assert crit[0].waited_on == "admission"
    assert crit[0].chain_s == pytest.approx(10.0)


def test_summary_text(store, known_batch):
    s = summarize(store, known_batch(store))
    assert s.makespan_s == pytest.approx(14.0)
    assert (s.samples_total, s.samples_completed, s.samples_failed) == (4, 4, 0)
    assert s.recomputed_tokens == 50
    text = s.to_text()
    assert "makespan" in text and "14.0" in text and "chain" in text


def test_tail_ten_samples(store):
    samples = [dict(task_id=f"t{i}", admitted=T0, finished=T0 + i + 1, status="completed", score=1.0, steps=[])
               for i in range(10)]
    a = _analysis(store, write_batch(store, samples))
    assert a.tail_s(0.9) == pytest.approx(1.0)
    assert a.tail_s(0.99) == pytest.approx(0.0)
    assert a.makespan_s == pytest.approx(10.0)
    assert a.lower_bound is None  # no steps, no work


def test_unknown_batch(store):
    with pytest.raises(UnknownBatch):
        load_batch(store, 12345)


def test_binned_average_matches_time_average():
    import numpy as np

    from agentbatch.dashboards.timeline import binned_average, occupancy, time_average

    c = occupancy(np.array([0.0, 1.0, 2.0]), np.array([4.0, 3.0, 2.5]))  # levels 1,2,3,2,1,0 at 0,1,2,2.5,3,4
    b = binned_average(c, 0.0, 4.0, bins=4)
    assert list(b["t"]) == [0.0, 1.0, 2.0, 3.0]
    assert list(b["level"]) == pytest.approx([1.0, 2.0, 2.5, 1.0])
    assert b["level"].mean() == pytest.approx(time_average(c, 0.0, 4.0))


def test_batch_from_frames_gives_the_same_figures(store, known_batch):
    from agentbatch.dashboards.frames import batch_from_frames

    data = load_batch(store, known_batch(store))
    steps = data.steps.drop(columns=["tool_calls", "output_tokens"])  # optional columns may be absent
    a = BatchAnalysis(batch_from_frames(data.samples, steps, config=data.config, name="virtual"))
    assert a.makespan_s == pytest.approx(14.0)
    assert a.lower_bound.value == pytest.approx(10.0)
    assert a.capacity.engine_workers == 2  # from the workers seen in the steps
    assert a.phases["orchestration"] == pytest.approx(3.0)
