"""Virtual time for samples an external harness sends (`VirtualConfig.harness`, the gateway): in trace
order, at most `harness` open at once, the next when one ends, whatever the admission order; a harness
that keeps every sample open runs as the runner admitting them all in arrival order."""

from __future__ import annotations

import pytest
from testkit import max_overlap

from agentbatch.sim.virtual_time import VirtualBatch, VirtualConfig
from agentbatch.traces import chain_priors, generate

CFG = dict(workers=1, profile="llama3-8b-h100", max_active=8, env_slots=8, admission_control="static")


def _open_at_once(samples: list[tuple]) -> int:
    """The most samples admitted and not yet finished at one time (admitted_at, finished_at: fields 4, 5)."""
    return max_overlap((s[4], s[5]) for s in samples)


def test_a_harness_of_two_keeps_two_samples_open_and_sends_the_next_when_one_ends() -> None:
    trace = generate("mcp_like", 6, seed=2)
    r = VirtualBatch(trace, VirtualConfig(**CFG, harness=2)).run()
    rows = sorted(r.samples, key=lambda s: s[0])
    assert _open_at_once(r.samples) == 2
    assert [s[4] for s in rows[:2]] == [0.0, 0.0]
    ends = {s[5] for s in rows}
    # sample k >= 2 is sent (and, the limit being free, admitted) at the instant an earlier one ended
    assert all(s[4] in ends and s[4] > 0 for s in rows[2:])
    assert [s[0] for s in sorted(rows[2:], key=lambda s: s[4])] == [2, 3, 4, 5]  # in trace order
    alone = VirtualBatch(trace, VirtualConfig(**CFG, admission_order="arrival")).run()
    assert r.makespan_s > alone.makespan_s  # two at a time is slower than eight


def test_the_harness_sends_in_its_order_whatever_the_admission_order() -> None:
    trace = generate("swe_like", 8, seed=3)
    priors = chain_priors(generate("swe_like", 8, seed=3, epoch=0))
    runs = [VirtualBatch(trace, VirtualConfig(**CFG, harness=3, priors=priors, admission_order=order)).run()
            for order in ("arrival", "longest_prior_first")]
    assert runs[0].samples == runs[1].samples
    # without a harness the order decides which samples start first
    free = [VirtualBatch(trace, VirtualConfig(**{**CFG, "max_active": 3}, priors=priors, admission_order=order)).run()
            for order in ("arrival", "longest_prior_first")]
    assert free[0].samples != free[1].samples


@pytest.mark.parametrize("harness", [8, 100])
def test_a_harness_that_keeps_every_sample_open_is_the_runner_admitting_all_in_arrival_order(harness: int) -> None:
    trace = generate("widesearch_like", 8, seed=1)
    sent = VirtualBatch(trace, VirtualConfig(**CFG, harness=harness)).run()
    admitted = VirtualBatch(trace, VirtualConfig(**CFG, admission_order="arrival")).run()
    assert sent.samples == admitted.samples and sent.makespan_s == admitted.makespan_s
