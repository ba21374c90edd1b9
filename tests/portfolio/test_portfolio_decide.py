"""Choosing by simulation (sim/portfolio.py): every candidate, the baselines among them, is simulated
by the same code; a candidate cut early could not have won; plugins add candidates by entry point."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES, Candidate, choose
from agentbatch.sim import portfolio as sim_portfolio
from agentbatch.sim.portfolio import Member, candidate_config, decide
from agentbatch.sim.virtual_time import VirtualConfig, simulate
from agentbatch.sim.virtual_time.simulation import VirtualBatch, context_priors
from agentbatch.traces import chain_priors, generate

PROFILE = "llama3-8b-h100"


def _case(family: str = "mcp_like", n: int = 12):
    earlier = generate(family, n, seed=3, epoch=0)
    base = VirtualConfig(workers=1, profile=PROFILE, env_slots=2)
    return earlier, base, Member(earlier, chain_priors(earlier), context_priors(earlier))


@pytest.mark.parametrize(("family", "workers", "slots"), [("mcp_like", 1, 2), ("bfcl_like", 2, 16), ("swe_like", 2, 3)])
def test_decide_predicts_each_candidate_as_a_full_simulation_and_cuts_only_losers(family, workers, slots):
    # a candidate whose run a simulated one answers (sim/portfolio.py _Run) is predicted as its own
    # full simulation would be: the answered ones included, every prediction is checked below
    earlier, _, member = _case(family)
    base = VirtualConfig(workers=workers, profile=PROFILE, env_slots=slots)
    d = decide([member], base, n_ref=6)
    assert d.simulations < len(d.candidates)
    full = {}
    for c in d.candidates:
        cfg = candidate_config(c, base, samples=len(earlier.samples), n_ref=6, priors=member.priors,
                               context_priors=member.context_priors)
        full[c.name] = VirtualBatch(earlier, cfg).run().makespan_s
        pred = d.predictions[c.name][0]
        if math.isfinite(pred):
            assert pred == full[c.name]  # the same code, the same number
        else:  # cut: it really ran past the point where it stopped
            assert full[c.name] > d.cut_at[c.name][0] > 0
    best_base = min(full[c.name] for c in d.candidates if c.baseline)
    best_other = min(full[c.name] for c in d.candidates if not c.baseline)
    assert full[d.choice.name] <= best_base  # never predicted slower than the best baseline
    if best_other < 0.99 * best_base:  # a clear winner among the others is what runs
        assert full[d.choice.name] == pytest.approx(best_other)
    else:
        assert d.choice.name == d.choice.fallback


@pytest.mark.parametrize("workers", [1, 2])
def test_a_candidate_that_runs_alike_to_one_simulated_is_not_simulated_again(workers):
    # with one worker every router routes there: the paper's coupled baseline (round robin) runs as
    # coupled at S*1 (trajectory-aware); with two it does not
    earlier, base, member = _case()
    base = VirtualConfig(workers=workers, profile=PROFILE, env_slots=2)
    pool = [c for c in BUILTIN_CANDIDATES if c.name in ("coupled at S*1", "coupled at slots (paper)")]
    d = decide([member, Member(generate("mcp_like", 12, seed=3, epoch=2), member.priors)], base, n_ref=6, pool=pool)
    assert d.simulations == (2 if workers == 1 else 4)
    for c in pool:
        cfg = candidate_config(c, base, samples=len(earlier.samples), n_ref=6)
        assert d.predictions[c.name][0] == simulate(earlier, cfg).summary.makespan_s


def test_the_summary_names_the_choice_and_every_candidate():
    _, base, member = _case(n=8)
    d = decide([member, member], base, n_ref=4)
    out = d.to_dict()
    assert out["chosen"] == d.choice.name and out["members"] == 2 and out["decide_s"] >= 0
    assert [r["name"] for r in out["candidates"]] == [c.name for c in d.candidates]
    chosen = next(r for r in out["candidates"] if r["name"] == out["chosen"])
    assert len(chosen["predicted_makespan_s"]) == 2 and None not in chosen["predicted_makespan_s"]


def test_without_history_the_ensemble_runs_the_deduplicated_portfolio():
    base = VirtualConfig(workers=1, profile=PROFILE, env_slots=2)
    members = [Member(generate("mcp_like", 8, seed=s, epoch=0)) for s in (11, 12)]
    d = decide(members, base, n_ref=4)
    assert len(d.candidates) < len(BUILTIN_CANDIDATES)
    assert all(c.env_queue != "caas_history" for c in d.candidates)
    assert all(len(p) == 2 for p in d.predictions.values())


def _install(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A real distribution on sys.path: its module and a dist-info with the entry point."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    dist = tmp_path / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[agentbatch.candidates]\n{name} = {name}:CANDIDATES\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sim_portfolio.plugin_candidates.cache_clear()


def test_a_plugin_adds_a_candidate_through_its_entry_point(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "mycands", """
        from agentbatch.scheduling.portfolio import Candidate
        CANDIDATES = [Candidate("mine: FIFO at 3 x N_ref", limit="n_ref", limit_factor=3.0, env_queue="fifo",
                                admission_control="static")]
    """)
    try:
        names = [c.name for c in sim_portfolio.portfolio()]
        assert names[-1] == "mine: FIFO at 3 x N_ref" and names[:-1] == [c.name for c in BUILTIN_CANDIDATES]
        _, base, member = _case(n=8)
        d = decide([member], base, n_ref=4)
        assert "mine: FIFO at 3 x N_ref" in d.predictions
    finally:
        sys.modules.pop("mycands", None)
        sim_portfolio.plugin_candidates.cache_clear()


def test_a_plugin_entry_point_that_is_not_a_candidate_is_refused(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "badcands", "CANDIDATES = ['defaults']\n")
    try:
        with pytest.raises(TypeError, match="must give Candidate objects"):
            sim_portfolio.portfolio()
    finally:
        sys.modules.pop("badcands", None)
        sim_portfolio.plugin_candidates.cache_clear()


def test_candidate_config_applies_the_limit_rule_and_leaves_baselines_without_priors():
    _, base, member = _case(n=8)
    fifo_all = next(c for c in BUILTIN_CANDIDATES if c.name == "decoupled FIFO, all admitted")
    cfg = candidate_config(fifo_all, base, samples=8, n_ref=4, priors=member.priors)
    assert (cfg.max_active, cfg.coupled, cfg.priors, cfg.env_slots) == (8, False, None, 2)
    mine = Candidate("x", limit="slots", limit_factor=0.5)
    cfg = candidate_config(mine, base, samples=8, n_ref=4, priors=member.priors)
    assert cfg.max_active == 1 and cfg.priors == member.priors


@pytest.mark.parametrize(("family", "slots", "workers"), [("mcp_like", 2, 1), ("widesearch_like", 4, 2)])
def test_on_an_ensemble_cutting_never_changes_the_choice_and_the_choice_never_loses_to_the_fallback(
        family: str, slots: int, workers: int) -> None:
    # three reruns of the same tasks with the priors of the first (what history gives), every
    # candidate also simulated to its end: the rule on full predictions picks what decide picked
    n, margin = 10, 0.01
    earlier = generate(family, n, seed=5, epoch=0)
    pri, ctx = chain_priors(earlier), context_priors(earlier)
    members = [Member(generate(family, n, seed=5, epoch=e), pri, ctx) for e in (0, 2, 3)]
    base = VirtualConfig(workers=workers, profile=PROFILE, env_slots=slots)
    d = decide(members, base, n_ref=4, margin=margin)
    full = {c.name: [simulate(m.trace, candidate_config(c, base, samples=n, n_ref=4, priors=pri,
                                                         context_priors=ctx)).summary.makespan_s for m in members]
            for c in d.candidates}  # fmt: skip
    for name, preds in d.predictions.items():  # a cut run really passed the point where it stopped
        for pred, real, at in zip(preds, full[name], d.cut_at[name], strict=True):
            assert pred == pytest.approx(real, rel=1e-9) if math.isfinite(pred) else real >= at
    picked = choose(full, d.candidates, margin)
    assert picked.name == d.choice.name and picked.fallback == d.choice.fallback
    chosen, fallback = full[d.choice.name], full[d.choice.fallback]
    factor = 1.0 if d.choice.name == d.choice.fallback else 1 - margin
    assert all(t <= factor * f for t, f in zip(chosen, fallback, strict=True))  # in every member
