"""The real-time simulated engine keeps its own clock while busy: a late wake-up of the event loop
(timer rounding, a loaded host) is made up, not added to every request's time; only a lag beyond
MAX_BEHIND_S (a starved process) moves the model's clock to the wall clock."""

from __future__ import annotations

import asyncio
import time
from array import array

import pytest

from agentbatch.engines import sim_timing
from agentbatch.engines.sim_timing import SimulatedTiming
from agentbatch.sim.model import RequestStats, SimRequest


async def _run_with_stall(stall_s: float) -> tuple[list[RequestStats], float]:
    """Two requests decode together while another task blocks the loop for `stall_s` mid-way; a
    third arrives during the stall. Returns their stats and the model's busy time."""
    timing = SimulatedTiming("llama3-8b-h100", time_scale=0.05)

    def req(i: int) -> SimRequest:
        return SimRequest(f"r{i}", i, array("q", range(i * 10_000, i * 10_000 + 2_000)), 200)

    async def stall_then_submit() -> RequestStats:
        await asyncio.sleep(0.01)
        time.sleep(stall_s)  # the event loop is blocked: every sleep in it wakes late
        return await timing.submit(req(2))

    try:
        stats = await asyncio.gather(timing.submit(req(0)), timing.submit(req(1)), stall_then_submit())
        return list(stats), timing.model.counters.busy_s_total
    finally:
        await timing.aclose()


def test_a_late_wake_up_is_made_up_while_the_engine_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_timing, "MAX_BEHIND_S", 60.0)  # any host lag is catch-up here
    stats, busy = asyncio.run(_run_with_stall(0.2))
    # The engine never idled, so its steps follow one another: the last request ends when they add up
    # to, although the loop stalled for 0.2 s wall (4 model seconds at this scale).
    assert max(s.finished for s in stats) == pytest.approx(min(s.first_scheduled for s in stats) + busy, abs=1e-9)
    late = stats[2]  # arrived during the lag: stamped no later than the step it joined
    assert late.first_scheduled >= late.arrival and late.queue_s >= 0.0


def test_a_starved_engine_follows_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_timing, "MAX_BEHIND_S", 0.0)  # the old rule: every lag moves the clock
    stats, busy = asyncio.run(_run_with_stall(0.2))
    span = max(s.finished for s in stats) - min(s.first_scheduled for s in stats)
    assert span > busy + 3.0  # the 0.2 s stall is 4 model seconds that the engine waited
