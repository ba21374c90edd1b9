"""Report sections that explain a run: config and policies, config diff, failed samples with reasons,
scores per group and per task, hints; and the noise-aware comparison."""

from __future__ import annotations

import copy

import pytest
from dashboards_batches import KNOWN_CONFIG, T0, known_samples, write_batch

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.compare import MIN_SPREAD, compare
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.sections import (
    config_diff,
    failed_samples,
    group_scores,
    hints,
    policies_table,
    task_scores,
)

CONFIG = {**KNOWN_CONFIG, "scheduling": {**KNOWN_CONFIG["scheduling"], "max_active_samples": 2,
                                         "router": {"name": "round_robin", "params": {}}},
          "engine": {"kind": "scripted", "params": {"workers": 2}}}


def mixed_samples() -> list[dict]:
    """The known samples, one of them failed with a reason, in two task groups."""
    s = known_samples()
    s[1].update(status="failed", score=None, error="EnvironmentError: sandbox start failed after 3 attempts")
    for x, g in zip(s, ("base", "base", "miss_func", "miss_func"), strict=True):
        x["group"] = g
    return s


def test_policies_failed_groups_tasks(store):
    a = BatchAnalysis(load_batch(store, write_batch(store, mixed_samples(), config=CONFIG, workers=("w0", "w1"))))
    pol = policies_table([a])
    col = pol.columns[0]
    assert pol.loc["router", col] == "round_robin" and pol.loc["max_active_samples", col] == 2
    assert pol.loc["engine", col] == "scripted" and pol.loc["env_queue", col] == "-"  # absent -> "-"

    failed = failed_samples(a)
    assert list(failed["task"]) == ["t1"]
    assert failed.loc[0, "reason"].startswith("EnvironmentError: sandbox start failed")
    assert failed.loc[0, "failed attempts"] == 1  # its failed environment attempt

    groups = group_scores(a)
    assert groups.loc["base", "samples"] == 2 and groups.loc["base", "failed"] == 1
    assert groups.loc["base", "mean score"] == 1.0  # t0 only: the failed one has no score
    assert groups.loc["miss_func", "mean score"] == 1.0

    tasks = task_scores(a)
    assert list(tasks.index[:1]) == ["t1"]  # unscored (failed) first, then lowest score
    assert tasks.loc["t1", "failed"] == 1 and tasks.loc["t0", "mean score"] == 1.0


def test_hints_name_the_binding_wait(store):
    # Every sample admitted late: admission is what the last samples waited on.
    s = known_samples()
    for i, x in enumerate(s):
        x["admitted"] = T0 + 3.0 * (i + 1)
    bid = write_batch(store, s, config=CONFIG, workers=("w0", "w1"))
    found = hints(BatchAnalysis(load_batch(store, bid)))
    text = " ".join(f"{h.finding} {h.action}" for h in found)
    assert "waited longest for admission" in text and "max_active_samples" in text and "agentbatch plan" in text
    assert "round_robin" not in text or "trajectory_aware" in text


def test_config_diff_and_noise_aware_compare(store):
    other = copy.deepcopy(CONFIG)
    other["scheduling"]["router"] = {"name": "trajectory_aware", "params": {}}
    a = write_batch(store, known_samples(), config={**CONFIG, "name": "a"}, workers=("w0", "w1"))
    same = write_batch(store, known_samples(shift=40.0), config={**CONFIG, "name": "b"}, workers=("w0", "w1"))
    diff = write_batch(store, known_samples(shift=80.0), config=other, workers=("w0", "w1"))
    analyses = [BatchAnalysis(load_batch(store, b)) for b in (a, same, diff)]

    d = config_diff(analyses)
    assert list(d.index) == ["scheduling.router.name"]  # the name is not a difference
    assert d.iloc[0].tolist() == ['"round_robin"', '"round_robin"', '"trajectory_aware"']
    assert config_diff(analyses[:2]).empty

    cmp = compare(analyses[:2])
    assert cmp.spread >= MIN_SPREAD
    assert cmp.within_noise(cmp.summaries[1]) is True  # identical timings
    text = cmp.to_text()
    assert "within this host's run-to-run spread" in text
    assert "config        identical" in text and "virtual time" in text
    assert "1 field(s) differ: scheduling.router.name" in compare([analyses[0], analyses[2]]).to_text()


def test_spread_grows_with_unexplained_time(store):
    """Host overhead (time the steps do not explain) widens the spread a comparison allows."""
    slow = known_samples()
    for x in slow:
        x["finished"] += 6.0  # 6 s per sample that no step explains: orchestration
    a = write_batch(store, known_samples(), config=CONFIG, workers=("w0", "w1"))
    b = write_batch(store, slow, config=CONFIG, workers=("w0", "w1"))
    fa, fb = (BatchAnalysis(load_batch(store, x)) for x in (a, b))
    assert fb.host_noise > fa.host_noise
    cmp = compare([fa, fb])
    assert cmp.spread == max(MIN_SPREAD, fa.host_noise, fb.host_noise)
    assert cmp.within_noise(cmp.summaries[1]) == (abs(cmp.summaries[1].makespan_s / 14.0 - 1) <= cmp.spread)


def serial_samples() -> list[dict]:
    """Three samples admitted one after another, each one 4 s inference step on w0, back to back."""
    return [dict(task_id=f"s{i}", admitted=T0 + 4 * i, finished=T0 + 4 * i + 4, status="completed", score=1.0,
                 steps=[dict(index=0, kind="inference", enq=T0 + 4 * i, start=T0 + 4 * i, fin=T0 + 4 * i + 4,
                             worker="w0", prefill=1.0, decode=3.0, prompt=10, cached=0, eq=0.0)])
            for i in range(3)]


@pytest.mark.parametrize("inflight, busy", [(1, True), (4, False)])
def test_admission_hint_only_when_capacity_had_room(store, inflight, busy):
    config = {"scheduling": {"env_slots": 1, "per_worker_inflight": inflight, "max_active_samples": 1},
              "engine": {"params": {"workers": 1}}}
    a = BatchAnalysis(load_batch(store, write_batch(store, serial_samples(), config=config, workers=("w0",))))
    (first, *_) = hints(a)
    assert "waited longest for admission" in first.finding
    if busy:  # the worker was never idle: more admitted samples would only queue
        assert "busy (100% at most)" in first.finding and "more capacity" in first.action
    else:
        assert "raise scheduling.max_active_samples" in first.action
