"""Re-planning a live batch (flows/replan.py): a batch started on a slow candidate switches at a
checkpoint from what the store recorded, the switch is kept with the batch (a resume runs what was
switched to) and in the run's summary, and the batch ends whole, each step recorded once."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from testkit import max_overlap

import agentbatch.flows.batch as batch_module
from agentbatch.dashboards.summary import summarize
from agentbatch.db.store import Store
from agentbatch.flows.cli import main as cli
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.policy_choice import (
    PolicyChoice,
    apply_candidate,
    choose_policy,
    engine_base,
    live_plan,
)
from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.portfolio import Member, candidate_config, decide
from agentbatch.sim.virtual_time import VirtualBatch
from agentbatch.traces import generate, write_trace

NAMES = {c.name: c for c in BUILTIN_CANDIDATES}
SLOW = NAMES["coupled at S*0.25"]  # one sample at a time on 4 slots: far behind every other candidate


def _replay(trace: Path, db: str, policy: str) -> None:
    assert cli(["replay", str(trace), "--mode", "live", "--engine", "simulated", "--workers", "2",
                "--time-scale", "0.02", "--env-slots", "4", "--max-active", "5", "--policy", policy,
                "--db", db]) == 0  # fmt: skip


def _start_slow(config: Any, store: Any, batch_id: int, task_ids: list[str], workers: int,
                priors: dict[str, float]) -> PolicyChoice:
    """policy auto's real decision and plan, but the batch starts on SLOW (as a choice made on a
    misleading history would)."""
    real = choose_policy(config, store, batch_id, task_ids, workers, priors)
    assert real.plan is not None, "auto decided from the history, with re-planning on"
    member = real.plan.members[0]
    cfg = candidate_config(SLOW, real.plan.base, samples=len(task_ids), n_ref=real.plan.n_ref,
                           priors=member.priors, context_priors=member.context_priors)  # fmt: skip
    predicted = VirtualBatch(member.trace, cfg).run().makespan_s
    plan = replace(real.plan, first=SLOW, every_s=0.1 * predicted)
    summary = {**real.summary, "chosen": SLOW.name}
    chosen = apply_candidate(config, SLOW, len(task_ids))
    chosen = chosen.model_copy(update={"scheduling": chosen.scheduling.model_copy(update={"choice": summary})})
    return PolicyChoice(chosen, summary, plan)


def test_a_live_batch_started_on_a_slow_candidate_switches_and_keeps_the_switch(
        tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    batch = tmp_path / "b.parquet"
    write_trace(generate("widesearch_like", 10, seed=2, epoch=1), batch)
    for epoch in (0, 2, 3):  # three earlier runs: re-planning needs three members (sim/replan.py MIN_MEMBERS)
        history = tmp_path / f"h{epoch}.parquet"
        write_trace(generate("widesearch_like", 10, seed=2, epoch=epoch), history)
        _replay(history, sqlite_url, "configured")
    monkeypatch.setattr(batch_module, "choose_policy", _start_slow)
    with caplog.at_level(logging.INFO, logger="agentbatch.replan"):
        _replay(batch, sqlite_url, "auto")
    store = Store(sqlite_url)
    try:
        row = store.list_batches()[-1]
        scheduling = row.config["scheduling"]
        switches = scheduling["choice"]["switches"]
        assert switches and switches[0]["from"] == SLOW.name and switches[0]["predicted_ratio"] < 0.98
        assert scheduling["policy"] == switches[-1]["to"] != SLOW.name  # a resume runs what was switched to
        to = NAMES[switches[-1]["to"]]
        to = to if scheduling["priors"] else to.without_priors()  # replay pins no priors: the pool's variant
        assert scheduling["coupled"] == to.coupled and scheduling["env_queue"]["name"] == to.env_queue
        assert "re-planned at" in caplog.text
        done = scheduling["choice"]["replan"]
        assert done["switches"] == len(switches) and done["checkpoints"] >= len(switches) and done["cpu_s"] > 0
        assert f"re-planned: at {switches[0]['at_wall_s']:.1f} s {SLOW.name} ->" in summarize(store, row.id).to_text()
        samples = store.samples(row.id)
        assert len(samples) == 10 and all(s.status == "completed" for s in samples)
        once = Counter((st.sample_id, st.index) for st in store.steps(row.id) if st.status == "completed")
        assert set(once.values()) == {1}
        # SLOW runs one sample at a time; after the switch several ran at once
        spans = [(s.admitted_at, s.finished_at) for s in samples]
        assert max_overlap(spans) >= 2
    finally:
        store.close()


def test_fewer_than_three_earlier_runs_do_not_re_plan() -> None:
    # with fewer members the rule sees too few realisations: no re-planning on them
    config = BatchConfig.model_validate({"engine": {"kind": "openai", "params": {
        "endpoints": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "timing": {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 1.0}}}})  # fmt: skip
    runs = [generate("mcp_like", 4, seed=3, epoch=e) for e in (0, 1, 2)]
    members = [Member(t) for t in runs]
    base = engine_base(config, 1, runs)
    for n, planned in ((1, False), (2, False), (3, True)):
        d = decide(members[:n], base, n_ref=2)
        assert (live_plan(config, d, members[:n], base) is not None) == planned
    off = config.model_copy(update={"scheduling": config.scheduling.model_copy(update={
        "replan": config.scheduling.replan.model_copy(update={"every": 0.0})})})  # fmt: skip
    assert live_plan(off, decide(members, base, n_ref=2), members, base) is None
