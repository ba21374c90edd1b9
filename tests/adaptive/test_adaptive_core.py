"""The controller inside the scheduling core (both clocks), and in virtual time on a KV-bound batch."""

from __future__ import annotations

from agentbatch.scheduling.admission_control import EngineMeasurements
from agentbatch.scheduling.caas import CaasHistoryQueue
from agentbatch.scheduling.core import ADMISSION
from agentbatch.scheduling.policies import AdmissionLimits
from agentbatch.scheduling.registry import PolicySpec, build_core
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import VirtualConfig, simulate
from agentbatch.traces import generate

POLICIES = {"env_queue": PolicySpec("caas"), "inference_queue": PolicySpec("fifo"),
            "router": PolicySpec("trajectory_aware"), "priority": PolicySpec("chain_progress")}  # fmt: skip


def test_build_core_gives_the_controller_to_decoupled_adaptive_cores_only() -> None:
    adaptive = build_core(AdmissionLimits(max_active_samples=6, env_slots=2), ["w0"], **POLICIES)
    assert adaptive.controller is not None and adaptive.controller.limit == 6
    static = build_core(AdmissionLimits(6, 2), ["w0"], admission_control="static", **POLICIES)
    coupled = build_core(AdmissionLimits(6, 2, coupled=True), ["w0"], **POLICIES)
    assert static.controller is None and coupled.controller is None


def test_thrash_lowers_the_limit_and_an_idle_gpu_admits_the_waiting_samples() -> None:
    counters = {"c": EngineMeasurements()}
    core = build_core(AdmissionLimits(max_active_samples=8, env_slots=4, per_worker_inflight=64), ["w0"], **POLICIES)
    core.engine_counters = lambda: counters["c"]
    samples = [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i) for i in range(12)]
    for s in samples:
        core.submit(core.admission_ticket(s, 0.0), 0.0)
    assert core.admission.in_use == 8 and len(core.admission.queue) == 4
    window = core.controller.window  # type: ignore[union-attr]

    def run_window(now: float, recomputed: float) -> list:
        grants = []
        for k in range(window):
            s = samples[k % 8]
            t = StepTicket(sample=s, kind=StepKind.INFERENCE, step_index=k, enqueued_at=now)
            (g,) = core.submit(t, now)
            c = counters["c"]
            counters["c"] = EngineMeasurements(prompt_tokens=c.prompt_tokens + 100, cached_tokens=c.cached_tokens + 90,
                                           recomputed_tokens=(c.recomputed_tokens or 0) + recomputed)  # fmt: skip
            grants += core.complete(t, g.slot, now)
        return grants

    run_window(1.0, 0.0)  # sets the controller's reference
    assert run_window(2.0, 20.0) == [] and core.admission_limit == 6  # 20 % recomputed: 0.75 x 8 admitted
    assert core.admission.capacity == 6 and core.admission.in_use == 8  # nothing running is stopped
    for s in samples[:3]:  # three samples end: one seat frees (8 -> 5 admitted, limit 6)
        core.finish(s, 3.0)
    assert core.admission.in_use == 6
    assert run_window(4.0, 0.0) == [] and core.admission_limit == 6  # the back-off relieved the recompute
    grants = run_window(5.0, 0.0)  # no thrash, samples wait, nothing queued in the engines: grow
    assert core.admission_limit == 7  # and no further: 8 admitted is where thrash began
    assert [g.resource for g in grants] == [ADMISSION] and grants[0].ticket.sample.sample_id == 9


def _kv_bound() -> tuple:
    trace = generate("swe_like", 48, seed=3, epoch=1)
    profile = get_profile("llama3-8b-h100").replace(num_kv_blocks=4200)  # ~67k tokens: far below 24 contexts
    return trace, VirtualConfig(workers=1, profile=profile, env_slots=16, max_active=32, per_worker_inflight=None)


def test_virtual_adaptive_admission_backs_off_a_thrashing_cache() -> None:
    trace, cfg = _kv_bound()
    static = simulate(trace, VirtualConfig(**{**cfg.__dict__, "admission_control": "static"}))
    adaptive = simulate(trace, cfg)
    reasons = {r for _, _, r in adaptive.raw.admission_limits}
    assert "thrash" in reasons and min(lim for _, lim, _ in adaptive.raw.admission_limits) < 32
    assert max(lim for _, lim, _ in adaptive.raw.admission_limits) <= 32  # no growth past the start
    assert static.raw.admission_limits == []
    assert adaptive.summary.makespan_s < static.summary.makespan_s
    assert adaptive.summary.mean_score == static.summary.mean_score


def test_history_rank_progress_orders_by_progress_then_prior() -> None:
    q = CaasHistoryQueue(max_wait_s=None, rank="progress")
    a = SampleProgress(sample_id=0, task_id="a", arrival_seq=0, steps_done=5, prior_chain_steps=6)
    b = SampleProgress(sample_id=1, task_id="b", arrival_seq=1, steps_done=3, prior_chain_steps=40)
    c = SampleProgress(sample_id=2, task_id="c", arrival_seq=2, steps_done=3, prior_chain_steps=60)
    for s in (b, a, c):
        q.push(StepTicket(sample=s, kind=StepKind.ENVIRONMENT, step_index=1, enqueued_at=0.0))
    # the leader keeps its lead (its prefix is warm); the prior breaks the tie between b and c
    assert [q.pop(0.0).sample.task_id for _ in range(3)] == ["a", "c", "b"]
