"""The admission controller on its own: thrash backs off, an idle GPU grows the limit back, and the
signals that do not mean pressure leave it alone."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.admission_control import (
    AdmissionController,
    AdmissionSignals,
    ControllerSettings,
    EngineCounters,
)


def _sig(steps: int, *, prompt: float, cached: float = 0.0, recomputed: float | None = 0.0, preempt: float = 0.0,
         kv: float = 0.3, admitted: int = 40, waiting: int = 10, env_queued: int = 0, engine_waiting: int = 0,
         ) -> AdmissionSignals:  # fmt: skip
    eng = EngineCounters(prompt_tokens=prompt, cached_tokens=cached, preemptions=preempt, recomputed_tokens=recomputed,
                         kv_usage=kv, waiting=engine_waiting)  # fmt: skip
    return AdmissionSignals(admitted=admitted, waiting_admission=waiting, env_queued=env_queued, env_slots=8,
                            inference_queued=0, steps_completed=steps, engine=eng)  # fmt: skip


def _primed(start: int = 40) -> AdmissionController:
    c = AdmissionController(start, ControllerSettings(window_steps=10))
    assert c.due(10)
    assert c.update(_sig(10, prompt=1000, cached=900)) == start  # the first window only sets the reference
    return c


def test_recompute_backs_off_below_the_admitted_samples() -> None:
    c = _primed()
    assert not c.due(15) and c.due(20)
    # 10 % of the window's prompt tokens were recomputed: thrash, 0.75 x the 30 admitted
    limit = c.update(_sig(20, prompt=2000, cached=1800, recomputed=100, admitted=30))
    assert limit == 22 and c.history[-1].reason == "thrash"


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "no-metrics"])
def test_idle_gpu_grows_above_the_start_only_when_measured(measured: bool) -> None:
    c = _primed()
    c.due(20)
    c.update(_sig(20, prompt=2000, cached=1800, recomputed=100, admitted=40))
    assert c.limit == 30
    steps, prompt = 20, 2000.0
    limits = []
    for _ in range(12):
        steps += 10
        prompt += 1000
        c.due(steps)
        sig = _sig(steps, prompt=prompt, cached=prompt * 0.9, recomputed=100, admitted=c.limit)
        if not measured:  # no metrics source: zeros are no evidence that the GPU idles
            sig = AdmissionSignals(**{**{f: getattr(sig, f) for f in sig.__slots__},
                                      "engine": EngineCounters(measured=False)})  # fmt: skip
        limits.append(c.update(sig))
    assert limits[0] > 30 and limits == sorted(limits)
    assert max(limits) > 40 if measured else max(limits) == 40


@pytest.mark.parametrize(
    "change",
    [{"env_queued": 9}, {"engine_waiting": 3}, {"kv": 0.9}, {"waiting": 0}],
    ids=["environment-bound", "engine-queueing", "kv-full", "no-sample-waiting"],
)
def test_no_growth_unless_more_samples_would_feed_an_idle_gpu(change: dict) -> None:
    c = _primed()
    c.due(20)
    c.update(_sig(20, prompt=2000, cached=1800, recomputed=100))  # back off to 30
    c.due(30)
    args = {"prompt": 3000, "cached": 2700, "recomputed": 100, "admitted": 30, **change}
    assert c.update(_sig(30, **args)) == 30 and c.history[-1].reason == "hold"


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
    assert c.limit == c.floor == 2
    assert all(d.reason == "thrash" for d in c.history)


def test_start_must_be_positive() -> None:
    with pytest.raises(ValueError, match="start limit must be >= 1"):
        AdmissionController(0)
