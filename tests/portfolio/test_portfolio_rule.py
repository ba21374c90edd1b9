"""The portfolio (scheduling/portfolio.py): one registry of candidates, and the rule that picks one
from predicted makespans; the pick is never predicted slower than the best baseline."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbatch.scheduling.portfolio import (
    BASELINE_GROUPS,
    BUILTIN_CANDIDATES,
    Candidate,
    applicable,
    candidates,
    choose,
)

POOL = list(BUILTIN_CANDIDATES)
BASELINES = [c for c in POOL if c.baseline]


def test_the_portfolio_holds_every_baseline_and_the_defaults():
    groups = {c.baseline for c in BASELINES}
    assert groups == set(BASELINE_GROUPS)
    coupled = sorted(c.limit_factor for c in BASELINES if c.baseline == BASELINE_GROUPS[0])
    assert coupled == [0.25, 0.5, 1.0]  # the sweep S/4, S/2, S
    assert "defaults" in {c.name for c in POOL}
    orders = {c.admission_order for c in POOL}
    assert {"kv_balanced", "arrival", "longest_prior_first"} <= orders
    assert {c.admission_control for c in POOL} == {"adaptive", "static"}


def test_admission_limit_rules():
    kw = dict(samples=40, env_slots=8, n_ref=12)
    assert Candidate("a", limit="all").admission_limit(**kw) == 40
    assert Candidate("b", limit="n_ref", limit_factor=0.5).admission_limit(**kw) == 6
    assert Candidate("c", limit="slots", limit_factor=0.25).admission_limit(**kw) == 2
    assert Candidate("d", limit="slots", limit_factor=0.01).admission_limit(**kw) == 1
    with pytest.raises(ValueError, match="limit must be one of"):
        Candidate("e", limit="half")


def test_names_are_unique_and_plugins_come_after_the_builtins():
    extra = Candidate("mine", limit="all")
    assert candidates([extra])[-1] is extra
    with pytest.raises(ValueError, match="used twice"):
        candidates([Candidate("defaults")])
    with pytest.raises(TypeError, match="must be a Candidate"):
        candidates(["defaults"])  # type: ignore[list-item]


def test_without_priors_repeats_are_left_out_and_history_ranks_become_plain_caas():
    run = applicable(POOL, has_priors=False)
    assert len(run) < len(POOL)
    keys = [c.key() for c in run if not c.baseline]
    assert len(keys) == len(set(keys))
    assert all(c.env_queue != "caas_history" and c.admission_order == "arrival" for c in run)
    assert [c.name for c in run if c.baseline] == [c.name for c in BASELINES]
    assert applicable(POOL, has_priors=True) == POOL


def test_a_gain_below_the_margin_keeps_the_best_baseline():
    preds = {c.name: [100.0] for c in POOL}
    preds["coupled at S*0.5"] = [90.0]
    preds["defaults"] = [89.5]  # 0.6 % better than the best baseline: inside a 1 % margin
    choice = choose(preds, POOL, margin=0.01)
    assert choice.name == "coupled at S*0.5" and choice.fallback == "coupled at S*0.5"
    preds["defaults"] = [85.0]
    assert choose(preds, POOL, margin=0.01).name == "defaults"


def test_the_worst_member_decides():
    preds = {c.name: [100.0, 100.0] for c in POOL}
    preds["defaults"] = [60.0, 104.0]  # far better in one member, worse in the other
    preds["CAAS, all admitted"] = [95.0, 95.0]
    choice = choose(preds, POOL, margin=0.01)
    assert choice.name == "CAAS, all admitted"
    assert choice.scores["defaults"] == pytest.approx(1.04)


def test_a_win_that_depends_on_the_member_keeps_the_fallback():
    preds = {c.name: [100.0, 100.0, 100.0] for c in POOL}
    for b in BASELINES:
        preds[b.name] = [111.0, 111.0, 111.0]
    preds["coupled at slots (paper)"] = [104.0, 100.7, 107.8]  # the fallback: worst ratio 1.078
    preds["coupled at S*1"] = [100.0, 111.0, 100.0]
    preds["decoupled FIFO, all admitted"] = [111.0, 100.0, 111.0]
    # better worst ratio (1.044) than the fallback, but slower than it in the second member
    preds["defaults, arrival order"] = [101.0, 104.4, 101.6]
    choice = choose(preds, POOL, margin=0.01)
    assert choice.name == "coupled at slots (paper)" and choice.scores["defaults, arrival order"] < choice.score
    preds["defaults, arrival order"] = [101.0, 99.0, 101.6]  # beats it in every member by 1 %
    assert choose(preds, POOL, margin=0.01).name == "defaults, arrival order"


def test_bad_predictions_are_refused():
    with pytest.raises(ValueError, match="one prediction per ensemble member"):
        choose({"defaults": [1.0], "coupled at S*1": [1.0, 2.0]}, POOL)
    with pytest.raises(ValueError, match="no baseline"):
        choose({"defaults": [1.0], "coupled at S*1": [math.inf]}, POOL)
    with pytest.raises(ValueError, match="not in the portfolio"):
        choose({"nobody": [1.0], "coupled at S*1": [1.0]}, POOL)


makespans = st.floats(min_value=1.0, max_value=1e4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda m: st.lists(st.lists(makespans | st.just(math.inf), min_size=m, max_size=m),
                                                    min_size=len(POOL), max_size=len(POOL))),
       st.floats(0.0, 0.1))
def test_the_choice_is_never_predicted_slower_than_the_best_baseline(rows, margin):
    preds = {c.name: row for c, row in zip(POOL, rows, strict=True)}
    preds[BASELINES[0].name] = [x if math.isfinite(x) else 50.0 for x in preds[BASELINES[0].name]]
    choice = choose(preds, POOL, margin=margin)
    best_base = [min(preds[b.name][m] for b in BASELINES) for m in range(len(rows[0]))]
    chosen = preds[choice.name]
    assert all(t <= choice.score * b * (1 + 1e-12) for t, b in zip(chosen, best_base, strict=True))
    assert choice.score <= min(choice.scores[b.name] for b in BASELINES)
    if choice.name not in {b.name for b in BASELINES}:  # it beats the fallback by the margin in every member
        assert all(t <= (1 - margin) * f for t, f in zip(chosen, preds[choice.fallback], strict=True))
