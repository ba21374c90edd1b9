"""The "kv_balanced" admission order: LPT while the growing contexts of the samples admitted at
once fit in the engines' KV capacity; a long-context chain that would overflow it waits."""

from __future__ import annotations

from dataclasses import replace

from agentbatch.scheduling.admission_order import AdmissionHints, admission_sequence, kv_balanced_sequence
from agentbatch.scheduling.types import SampleProgress
from agentbatch.sim.profiles import get_profile
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import chain_priors, generate


def samples(steps: list[float | None]) -> list[SampleProgress]:
    return [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i, prior_chain_steps=p)
            for i, p in enumerate(steps)]


def ids(seq: list[SampleProgress]) -> list[int]:
    return [s.sample_id for s in seq]


def ctx(*peaks: float) -> dict[str, float]:
    return {f"t{i}": p for i, p in enumerate(peaks)}


def test_everything_fits_is_lpt() -> None:
    steps: list[float | None] = [10.0, 80.0, 20.0, 70.0, 30.0, 60.0, 40.0, 50.0]
    hints = AdmissionHints(ctx(*(1_000.0 * (s or 0) for s in steps)), admitted=4, kv_tokens=1e9)
    assert ids(admission_sequence(samples(steps), "kv_balanced", hints)) == [1, 3, 5, 7, 6, 4, 2, 0]


def test_a_second_long_context_waits_for_room() -> None:
    # two chains reaching 100k tokens cannot both be at their peak in 150k: the second longest
    # waits while the short ones run beside the longest (LPT would admit it second)
    order = kv_balanced_sequence(samples([100.0, 90.0, 10.0, 9.0]),
                                 AdmissionHints(ctx(100_000, 100_000, 1_000, 1_000), admitted=2, kv_tokens=150_000))
    assert ids(order) == [0, 2, 3, 1]
    assert ids(admission_sequence(samples([100.0, 90.0, 10.0, 9.0]), "longest_prior_first")) == [0, 1, 2, 3]


def test_contexts_that_peak_at_different_times_share() -> None:
    # peaks sum to 160k > 150k, but the short chain has ended before the long one grows past 90k
    order = kv_balanced_sequence(samples([100.0, 20.0, 5.0]),
                                 AdmissionHints(ctx(100_000, 60_000, 1_000), admitted=2, kv_tokens=150_000))
    assert ids(order) == [0, 1, 2]


def test_nothing_fits_takes_the_smallest_context() -> None:
    order = kv_balanced_sequence(samples([30.0, 20.0, 10.0]),
                                 AdmissionHints(ctx(5_000, 1_000, 3_000), admitted=3, kv_tokens=500))
    assert ids(order) == [1, 2, 0]


def test_samples_without_priors_come_last_in_the_given_order() -> None:
    hints = AdmissionHints(ctx(1.0, 1.0, 1.0), admitted=4, kv_tokens=1e9)  # t3 has no context prior
    order = admission_sequence(samples([5.0, None, 9.0, 50.0, 7.0]), "kv_balanced", hints)
    assert ids(order) == [2, 0, 1, 3, 4]


def test_without_hints_it_orders_as_longest_prior_first() -> None:
    steps: list[float | None] = [3.0, None, 9.0, 1.0]
    assert ids(admission_sequence(samples(steps), "kv_balanced")) == \
        ids(admission_sequence(samples(steps), "longest_prior_first")) == [2, 0, 3, 1]


def test_virtual_time_admits_in_the_kv_balanced_order() -> None:
    # a long-context family on one worker whose KV holds two of its longest contexts: the driver
    # passes the context priors, the admission limit and the KV capacity to the same function
    trace, earlier = generate("widesearch_like", 12, seed=3, epoch=1), generate("widesearch_like", 12, seed=3, epoch=0)
    profile = get_profile("llama3-8b-h100").replace(num_kv_blocks=200_000 // 16)
    base = VirtualConfig(workers=1, profile=profile, env_slots=4, max_active=4, per_worker_inflight=None,
                         env_queue=PolicySpec("fifo"), admission_control="static", record_grants=True,
                         priors=chain_priors(earlier), context_priors=context_priors(earlier))
    progress = [SampleProgress(sample_id=s.index, task_id=s.task_id, arrival_seq=s.index,
                               prior_chain_steps=base.priors[s.task_id]) for s in trace.samples]  # type: ignore[index]
    hints = AdmissionHints(base.context_priors or {}, 4, profile.kv_capacity_tokens)
    expected = ids(kv_balanced_sequence(progress, hints))
    assert expected != ids(admission_sequence(progress, "longest_prior_first"))  # the KV budget binds here

    def admitted(order: str) -> list[int]:
        grants = simulate(trace, replace(base, admission_order=order)).raw.grants
        return [g.sample_id for g in grants if g.resource == "admission"]

    assert admitted("kv_balanced") == expected
    assert admitted("kv_balanced")[:4] != admitted("longest_prior_first")[:4]
