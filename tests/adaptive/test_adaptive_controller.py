"""The admission controller on its own: thrash backs off (and a back-off that relieves nothing is
undone), an idle GPU grows the limit back, and the signals that do not mean pressure leave it alone."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.admission_control import (
    AdmissionController,
    AdmissionSignals,
    ControllerSettings,
    EngineMeasurements,
)


def _sig(steps: int, *, prompt: float, cached: float = 0.0, recomputed: float | None = 0.0, preempt: float = 0.0,
         kv: float = 0.3, admitted: int = 40, waiting: int = 10, env_queued: int = 0, engine_waiting: int = 0,
         ) -> AdmissionSignals:  # fmt: skip
    eng = EngineMeasurements(prompt_tokens=prompt, cached_tokens=cached, preemptions=preempt, recomputed_tokens=recomputed,
                         kv_usage=kv, waiting=engine_waiting)  # fmt: skip
    return AdmissionSignals(admitted=admitted, waiting_admission=waiting, env_queued=env_queued, env_slots=8,
                            inference_queued=0, steps_completed=steps, engine=eng)  # fmt: skip


def _primed(start: int = 40, ceiling: int | None = None) -> AdmissionController:
    c = AdmissionController(start, ControllerSettings(window_steps=10, ceiling=ceiling))
    assert c.due(10)
    assert c.update(_sig(10, prompt=1000, cached=900)) == start  # the first window only sets the reference
    return c


def test_recompute_backs_off_below_the_admitted_samples() -> None:
    c = _primed()
    assert not c.due(15) and c.due(20)
    # 20 % of the window's prompt tokens were recomputed: thrash, 0.75 x the 30 admitted
    limit = c.update(_sig(20, prompt=2000, cached=1800, recomputed=200, admitted=30))
    assert limit == 22 and c.history[-1].reason == "thrash"


def test_a_relieving_back_off_stays_and_the_limit_never_regrows_to_where_thrash_began() -> None:
    c = _primed(ceiling=80)
    c.due(20)
    assert c.update(_sig(20, prompt=2000, cached=1800, recomputed=200, admitted=40)) == 30
    c.due(30)  # 31 still admitted: the back-off has not taken effect, nothing is judged
    assert c.update(_sig(30, prompt=3000, cached=2700, recomputed=300, admitted=31)) == 30
    c.due(40)  # it took effect and the recompute fell from 20 % to 2 %: relieved
    assert c.update(_sig(40, prompt=4000, cached=3600, recomputed=320, admitted=30)) == 30
    assert [d.reason for d in c.history[-3:]] == ["thrash", "hold", "relieved"]
    steps, prompt = 40, 4000.0
    for _ in range(6):  # an idle GPU and samples waiting: grow, but only to below where thrash began
        steps, prompt = steps + 10, prompt + 1000
        c.due(steps)
        c.update(_sig(steps, prompt=prompt, cached=prompt * 0.9, recomputed=320, admitted=c.limit))
    assert c.thrash_at == 40 and c.limit == 39


def test_a_back_off_that_relieves_nothing_is_undone() -> None:
    # e.g. a hybrid engine with fewer state checkpoints than samples: it recomputes at any limit
    c = _primed()
    c.due(20)
    assert c.update(_sig(20, prompt=2000, cached=1200, recomputed=300, admitted=40)) == 30  # 30 %
    c.due(30)
    assert c.update(_sig(30, prompt=3000, cached=2000, recomputed=550, admitted=30)) == 40  # still 25 %
    assert c.history[-1].reason == "undo" and c.thrash_at is None
    c.due(40)  # the same level again is no longer thrash; only more than 1.5x the relieved-nothing level
    assert c.update(_sig(40, prompt=4000, cached=2800, recomputed=850, admitted=40, waiting=0)) == 40
    c.due(50)
    assert c.update(_sig(50, prompt=5000, cached=3300, recomputed=1350, admitted=40)) == 30  # 50 %


@pytest.mark.parametrize(("measured", "ceiling"), [(True, 64), (False, 64), (True, None)],
                         ids=["measured", "no-metrics", "no-ceiling"])
def test_idle_gpu_grows_above_the_start_only_when_measured_up_to_a_ceiling(measured: bool, ceiling: int | None,
                                                                          ) -> None:  # fmt: skip
    c = _primed(start=30, ceiling=ceiling)
    steps, prompt = 10, 1000.0
    limits = []
    for _ in range(12):
        steps += 10
        prompt += 1000
        c.due(steps)
        sig = _sig(steps, prompt=prompt, cached=prompt * 0.9, recomputed=0, admitted=c.limit)
        if not measured:  # no metrics source: zeros are no evidence that the GPU idles
            sig = AdmissionSignals(**{**{f: getattr(sig, f) for f in sig.__slots__},
                                      "engine": EngineMeasurements(measured=False)})  # fmt: skip
        limits.append(c.update(sig))
    assert limits == sorted(limits)
    # measured with a ceiling: up to it; without metrics or without a ceiling the start is the cap
    assert max(limits) == (64 if measured and ceiling else 30)


@pytest.mark.parametrize(
    "change",
    [{"env_queued": 9}, {"engine_waiting": 3}, {"kv": 0.9}, {"waiting": 0}],
    ids=["environment-bound", "engine-queueing", "kv-full", "no-sample-waiting"],
)
def test_no_growth_unless_more_samples_would_feed_an_idle_gpu(change: dict) -> None:
    c = _primed()
    c.due(20)
    c.update(_sig(20, prompt=2000, cached=1800, recomputed=200))  # back off to 30
    c.due(30)
    c.update(_sig(30, prompt=3000, cached=2700, recomputed=200, admitted=30))  # relieved: 0 % recomputed
    c.due(40)
    args = {"prompt": 4000, "cached": 3600, "recomputed": 200, "admitted": 30, **change}
    assert c.update(_sig(40, **args)) == 30 and c.history[-1].reason == "hold"


def test_a_hit_rate_drop_is_thrash_only_with_a_full_cache() -> None:
    # vLLM exports no recompute counter: the hit rate and preemptions stand for it
    c = _primed()
    c.due(20)
    assert c.update(_sig(20, prompt=2000, cached=1800, recomputed=None, waiting=0)) == 40  # hit rate 0.9
    c.due(30)
    assert c.update(_sig(30, prompt=3000, cached=2300, recomputed=None, kv=0.5, waiting=0)) == 40  # 0.5: other prompts
    c.due(40)
    assert c.update(_sig(40, prompt=4000, cached=2800, recomputed=None, kv=0.95)) == 30  # 0.5 with a full cache
    assert c.history[-1].reason == "thrash"


def test_preemptions_per_step_and_the_floor() -> None:
    c = _primed(start=8)
    steps = 10
    for i in range(10):
        steps += 10
        c.due(steps)
        c.update(_sig(steps, prompt=1000.0 * (i + 2), cached=900.0 * (i + 2), preempt=float(i + 1), admitted=c.limit))
    assert c.limit == c.floor == 4  # half the start
    assert all(d.reason == "thrash" for d in c.history)


def test_start_must_be_positive() -> None:
    with pytest.raises(ValueError, match="start limit must be >= 1"):
        AdmissionController(0)


@pytest.mark.parametrize(("finished", "recomputed", "grows"), [(30, 0.0, True), (29, 0.0, False), (30, 60.0, False)],
                         ids=["whole-chains-quiet", "too-few-finished", "recomputed-before"])
def test_without_a_ceiling_growth_past_the_start_needs_whole_chains_without_recompute(
        finished: int, recomputed: float, grows: bool) -> None:  # fmt: skip
    c = _primed(start=30)
    steps, prompt = 10, 1000.0
    for _ in range(4):
        steps, prompt = steps + 10, prompt + 1000
        c.due(steps)
        sig = _sig(steps, prompt=prompt, cached=prompt * 0.9, recomputed=recomputed, admitted=c.limit)
        c.update(AdmissionSignals(**{**{f: getattr(sig, f) for f in sig.__slots__}, "samples_finished": finished}))
    # 30 finished = the start: the cache held whole chains at this concurrency; 60 of 5000 prompt
    # tokens recomputed (1.2 %, no window near thrash) says it did not quite
    assert "thrash" not in {d.reason for d in c.history}
    assert (c.limit > 30) is grows
