"""Swapping the scheduling core's policies while the batch runs (`SchedulingCore.swap`, what
re-planning does on either clock): nothing granted is taken back, no waiting ticket is lost, held
environment slots become ordinary ones, and coupled mode is never entered mid-run."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.caas import CaasQueue
from agentbatch.scheduling.core import ADMISSION, ENVIRONMENT, PolicySwap, SchedulingCore
from agentbatch.scheduling.policies import AdmissionLimits, FcfsPriority, FifoQueue, RoundRobinRouter
from agentbatch.scheduling.routing import TrajectoryAwareRouter
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket


def _core(*, coupled: bool, active: int = 2, slots: int = 2, workers: tuple[str, ...] = ("w0",)) -> SchedulingCore:
    limits = AdmissionLimits(max_active_samples=active, env_slots=slots, per_worker_inflight=4, coupled=coupled)
    return SchedulingCore(limits, list(workers), FifoQueue(), {w: FifoQueue() for w in workers},
                          RoundRobinRouter(), FcfsPriority())  # fmt: skip


def _admit(core: SchedulingCore, n: int) -> list[SampleProgress]:
    samples = [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i) for i in range(n)]
    for s in samples:
        core.submit(core.admission_ticket(s, 0.0), 0.0)
    return samples


def _env(sample: SampleProgress, at: float = 0.0) -> StepTicket:
    return StepTicket(sample=sample, kind=StepKind.ENVIRONMENT, step_index=sample.steps_done, enqueued_at=at)


def test_leaving_coupled_mode_frees_idle_held_slots_at_once_and_busy_ones_when_their_action_ends():
    core = _core(coupled=True, active=2, slots=2)
    a, b, c = _admit(core, 3)  # a and b admitted, each holding a slot; c waits
    busy = _env(a)
    [grant] = core.submit(busy, 1.0)
    assert grant.slot.startswith("env-") and core.environment.in_use == 2 and not core.environment.free
    grants = core.swap(PolicySwap(coupled=False, admission_limit=3), 2.0)
    assert [(g.resource, g.ticket.sample.sample_id) for g in grants] == [(ADMISSION, c.sample_id)]
    assert not core.limits.coupled and core.environment.in_use == 1  # b's idle slot is back
    # c's action now takes the freed slot; a's running action keeps its slot until it ends
    [g_c] = core.submit(_env(c), 3.0)
    assert g_c.resource == ENVIRONMENT and core.environment.in_use == 2
    core.complete(busy, grant.slot, 4.0)
    assert core.environment.in_use == 1 and len(core.environment.free) == 1  # returned, not kept by a
    for s in (a, b, c):
        core.finish(s, 5.0)
    assert core.in_use() == {"admission": 0, "environment": 1, "w0": 0}  # c's action still runs
    assert core.environment.capacity == 2


def test_entering_coupled_mode_mid_run_is_refused():
    core = _core(coupled=False)
    _admit(core, 2)
    with pytest.raises(ValueError, match="coupled"):
        core.swap(PolicySwap(coupled=True), 1.0)


def test_waiting_tickets_move_to_the_new_queue_in_its_order_and_none_is_lost():
    core = _core(coupled=False, active=4, slots=1)
    samples = _admit(core, 4)
    for s, done in zip(samples, (0, 5, 2, 9), strict=True):
        s.steps_done = done
    tickets = [_env(s, 1.0) for s in samples]
    for t in tickets:
        core.submit(t, 1.0)  # the first runs, three wait
    assert len(core.environment.queue) == 3
    core.swap(PolicySwap(env_queue=CaasQueue()), 2.0)
    assert isinstance(core.environment.queue, CaasQueue) and len(core.environment.queue) == 3
    order = []
    running = tickets[0]
    for k in range(3):
        [g] = core.complete(running, "env-0", 3.0 + k)
        order.append(g.ticket.sample.sample_id)
        running = g.ticket
    assert order == [3, 1, 2]  # most progress first (CAAS), not arrival order


def test_a_ticket_served_by_the_starvation_guard_does_not_come_back_in_the_new_queue():
    # CaasQueue serves an aged ticket from its arrival list and skips its heap entry later by its
    # seq; moving the rest must not renumber a ticket the old queue still holds under that seq
    # (the served ticket would come back, and its step would run twice)
    core = _core(coupled=False, active=5, slots=1)
    core.swap(PolicySwap(env_queue=CaasQueue(max_wait_s=1.0)), 0.0)
    samples = _admit(core, 5)
    for s, done in zip(samples, (0, 3, 5, 9, 1), strict=True):
        s.steps_done = done
    first, aged, x, best, last = [_env(s, at) for s, at in zip(samples, (0.0, 0.0, 3.0, 3.0, 3.0), strict=True)]
    for t in (first, aged, x, best, last):
        core.submit(t, t.enqueued_at)  # the first runs, four wait
    [g] = core.complete(first, "env-0", 10.0)  # `aged` has waited 10 s > 1 s: served before the others
    assert g.ticket is aged
    core.swap(PolicySwap(env_queue=FifoQueue()), 11.0)
    moved = [core.environment.queue.pop(12.0) for _ in range(len(core.environment.queue))]
    assert moved == [best, x, last]  # most progress first, the served ticket not among them


def test_a_new_router_learns_where_each_prefix_lives():
    core = _core(coupled=False, active=2, slots=2, workers=("w0", "w1"))
    a, b = _admit(core, 2)
    for s in (a, b):  # round robin: a on w0, b on w1
        t = StepTicket(sample=s, kind=StepKind.INFERENCE, step_index=0, enqueued_at=0.0)
        [g] = core.submit(t, 0.0)
        core.complete(t, g.slot, 1.0)
    assert (a.last_worker, b.last_worker) == ("w0", "w1")
    core.swap(PolicySwap(router=TrajectoryAwareRouter()), 2.0)
    for s in (b, a):  # asked in the other order: still each to its home
        t = StepTicket(sample=s, kind=StepKind.INFERENCE, step_index=2, enqueued_at=2.0)
        core.submit(t, 2.0)
        assert t.worker == s.last_worker


def test_samples_waiting_for_admission_are_reordered_and_a_higher_limit_admits_them():
    core = _core(coupled=False, active=1, slots=2)
    samples = _admit(core, 4)  # 0 admitted; 1, 2, 3 wait in that order
    grants = core.swap(PolicySwap(admission_limit=3, admission_order=lambda w: sorted(w, key=lambda s: -s.sample_id)),
                       1.0)  # fmt: skip
    assert [g.ticket.sample.sample_id for g in grants] == [3, 2]
    core.finish(samples[0], 2.0)
    assert core.is_admitted(1)


def test_a_lower_limit_stops_no_admitted_sample_and_takes_effect_as_they_finish():
    core = _core(coupled=False, active=3, slots=2)
    samples = _admit(core, 5)
    assert core.swap(PolicySwap(admission_limit=1), 1.0) == []
    assert all(core.is_admitted(i) for i in range(3))
    core.finish(samples[0], 2.0)
    core.finish(samples[1], 2.0)
    assert not core.is_admitted(3)  # still 1 admitted (sample 2) = the new limit
    assert core.finish(samples[2], 3.0)[0].ticket.sample.sample_id == 3
