"""Admission orders of the scheduling core: LPT over all samples, or over the longest tenth only."""

from __future__ import annotations

import pytest

from agentbatch.scheduling.admission_order import admission_sequence
from agentbatch.scheduling.types import SampleProgress


def samples(priors: list[float | None]) -> list[SampleProgress]:
    return [SampleProgress(sample_id=i, task_id=f"t{i}", arrival_seq=i, prior_chain_steps=p)
            for i, p in enumerate(priors)]


def ids(seq: list[SampleProgress]) -> list[int]:
    return [s.sample_id for s in seq]


PRIORS: list[float | None] = [5.0, 40.0, None, 7.0, 30.0, 9.0, 2.0, 50.0, 3.0, 4.0, 6.0, 8.0, 1.0, 10.0, 11.0,
                              12.0, 13.0, 14.0, 15.0, 16.0, 17.0]  # 20 with a prior, one without


def test_arrival_keeps_the_given_order() -> None:
    assert ids(admission_sequence(samples(PRIORS), "arrival")) == list(range(len(PRIORS)))


def test_longest_prior_first_sorts_all_then_unknown() -> None:
    order = admission_sequence(samples(PRIORS), "longest_prior_first")
    assert [s.prior_chain_steps for s in order[:-1]] == sorted((p for p in PRIORS if p is not None), reverse=True)
    assert ids(order)[-1] == 2


def test_longest_tail_first_puts_only_the_longest_tenth_first() -> None:
    order = ids(admission_sequence(samples(PRIORS), "longest_tail_first"))
    assert order[:2] == [7, 1]  # 50 then 40: a tenth of the 20 samples with a prior
    rest = [i for i in range(len(PRIORS)) if i not in (7, 1)]
    assert order[2:] == rest  # everything else as given, the unknown one in its place
    assert sorted(order) == list(range(len(PRIORS)))


def test_longest_tail_first_takes_at_least_one_and_none_without_priors() -> None:
    assert ids(admission_sequence(samples([1.0, 9.0, 3.0]), "longest_tail_first")) == [1, 0, 2]
    assert ids(admission_sequence(samples([None, None]), "longest_tail_first")) == [0, 1]


def test_unknown_order_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="longest_tail_first"):
        admission_sequence(samples([1.0]), "shortest_first")
