"""The "kv_balanced" admission order: LPT while the expected contexts of the samples admitted at
once fit in the engines' KV capacity, long-context chains interleaved with short ones beyond."""

from __future__ import annotations

from agentbatch.scheduling.admission_order import AdmissionHints, admission_sequence, kv_balanced_sequence
from agentbatch.scheduling.types import SampleProgress


def samples(steps: list[float | None]) -> list[SampleProgress]:
    return [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i, prior_chain_steps=p)
            for i, p in enumerate(steps)]


def ids(seq: list[SampleProgress]) -> list[int]:
    return [s.sample_id for s in seq]


STEPS: list[float | None] = [10.0, 80.0, 20.0, 70.0, 30.0, 60.0, 40.0, 50.0]
CONTEXT = {f"t{i}": c for i, c in enumerate([1_000.0, 40_000.0, 2_000.0, 40_000.0, 3_000.0, 40_000.0,
                                            4_000.0, 5_000.0])}  # the three longest chains: long contexts


def test_everything_fits_is_lpt() -> None:
    hints = AdmissionHints(CONTEXT, admitted=4, kv_tokens=1e9)
    assert ids(admission_sequence(samples(STEPS), "kv_balanced", hints)) == \
        ids(admission_sequence(samples(STEPS), "longest_prior_first"))


def test_long_contexts_are_not_co_admitted_beyond_the_budget() -> None:
    # 4 admitted at once, room for two long contexts (80k) and short ones
    order = ids(kv_balanced_sequence(samples(STEPS), AdmissionHints(CONTEXT, admitted=4, kv_tokens=90_000)))
    assert order[:2] == [1, 3]  # the two longest chains start first (LPT)
    assert 5 not in order[:4]  # the third long context waits: it would not fit beside them
    assert order[2:4] == [7, 6]  # the longest chains that fit fill the other places
    # it starts once a long chain is expected to end (the 50- and 40-step chains end first, leaving
    # no room for 40k until sample 3 ends at step 70)
    assert sorted(order) == list(range(len(STEPS)))
    used = sum(CONTEXT[f"t{i}"] for i in order[:4])
    assert used <= 90_000


def test_nothing_fits_takes_the_smallest_context() -> None:
    order = ids(kv_balanced_sequence(samples(STEPS), AdmissionHints(CONTEXT, admitted=2, kv_tokens=500.0)))
    assert order[:2] == [0, 2]  # no context fits: smallest first (1k, 2k)


def test_samples_without_priors_come_last_in_the_given_order() -> None:
    ctx = dict(CONTEXT)
    del ctx["t7"]  # a chain prior but no context prior
    order = ids(admission_sequence(samples([*STEPS[:7], 50.0, None]), "kv_balanced",
                                   AdmissionHints(ctx, admitted=4, kv_tokens=1e9)))
    assert order[-2:] == [7, 8]
    assert order[:7] == [1, 3, 5, 6, 4, 2, 0]


def test_without_hints_it_orders_as_longest_prior_first() -> None:
    assert ids(admission_sequence(samples(STEPS), "kv_balanced")) == \
        ids(admission_sequence(samples(STEPS), "longest_prior_first"))
