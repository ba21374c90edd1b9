"""A gateway batch re-plans as its samples arrive (flows/replan.py through `agentbatch gateway`): a
batch started on a slow candidate switches at a checkpoint from what the store recorded, with the
samples not yet sent drawn from the suite's history; the switch is stored with the batch and named
by GET /v1/batch, and afterwards the samples the harness sent run side by side."""

from __future__ import annotations

import argparse
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_helpers import MODEL, sim_workers
from testkit import answers, free_port, max_overlap, wait_until

import agentbatch.flows.policy_choice as policy_choice
from agentbatch.db.store import Store
from agentbatch.db.trace_io import import_trace
from agentbatch.flows.commands import gateway as gateway_command
from agentbatch.flows.policy_choice import PolicyChoice, apply_candidate
from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES
from agentbatch.sim.portfolio import Member
from agentbatch.sim.replan import Revealed
from agentbatch.sim.replan_live import replay_trace
from agentbatch.traces import generate

NAME = "gw-replan"
SLOW = next(c for c in BUILTIN_CANDIDATES if c.name == "coupled at S*0.25")  # one sample at a time on 4 slots
SAMPLES, HARNESS, REQUESTS = 6, 6, 4
TIMING = {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 0.05}
CHECKPOINT_S = 2.5  # wall seconds between checkpoints: SLOW takes some 8 s on these samples


def test_samples_not_yet_sent_are_the_history_s_at_their_positions() -> None:
    member = Member(generate("mcp_like", 5, seed=1, epoch=0))
    arrived = generate("mcp_like", 2, seed=1, epoch=1)
    trace = replay_trace(arrived, Revealed({0: 0, 1: 0}), member, expected=5)
    assert [s.index for s in trace.samples] == [0, 1, 2, 3, 4]
    assert [s.task_id for s in trace.samples[2:]] == [s.task_id for s in member.trace.samples[2:]]
    assert trace.samples[3].steps == member.trace.samples[3].steps
    assert len(replay_trace(arrived, Revealed({0: 0, 1: 0}), member).samples) == 2  # `run`: all are recorded


def _history(store: Store) -> None:
    for epoch in (0, 2, 3):  # re-planning needs three earlier runs (sim/replan.py MIN_MEMBERS)
        trace = generate("mcp_like", SAMPLES, seed=4, epoch=epoch)
        trace.samples = [replace(s, admitted_at=0.0, finished_at=10.0) for s in trace.samples]
        import_trace(store, trace, name=NAME)


def _start_slow(real: Any) -> Any:
    """policy auto's real decision and plan for the gateway, but the batch starts on SLOW (as a
    choice on a misleading history would), with checkpoints every CHECKPOINT_S."""

    def choose(config: Any, store: Any, workers: int, **kwargs: Any) -> PolicyChoice:
        choice = real(config, store, workers, **kwargs)
        assert choice.plan is not None, "auto decided from the history, with re-planning on"
        plan = replace(choice.plan, first=SLOW, every_s=CHECKPOINT_S / TIMING["time_scale"])
        summary = {**choice.summary, "chosen": SLOW.name}
        slow = apply_candidate(config, SLOW, SAMPLES)
        slow = slow.model_copy(update={"scheduling": slow.scheduling.model_copy(update={"choice": summary})})
        return PolicyChoice(slow, summary, plan)

    return choose


def test_a_gateway_batch_started_on_a_slow_candidate_switches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    _history(Store(db))
    monkeypatch.setattr(policy_choice, "choose_gateway_policy", _start_slow(policy_choice.choose_gateway_policy))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with sim_workers(2) as workers:
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({"name": NAME, "scheduling": {"env_slots": 4}, "engine": {
            "kind": "openai", "params": {"timing": TIMING, "endpoints": [
                {"name": w.name, "base_url": w.base_url, "model": MODEL} for w in workers]}}}))  # fmt: skip
        args = argparse.Namespace(
            config=path, db=db, host="127.0.0.1", port=port, expect=None, report=None, no_progress=True,
            idle_timeout=300.0, no_end_on_answer=True, allow_host=[], mcp=[], mcp_per_sample=[], batch=None,
            member=False, harness_concurrency=HARNESS, processes=1, no_prefect=True)  # fmt: skip
        codes: list[int] = []
        server = threading.Thread(target=lambda: codes.append(gateway_command.main(args)), daemon=True)
        server.start()
        wait_until(lambda: answers(base + "/health"), 120, "the gateway", alive=server.is_alive)
        threads = [threading.Thread(target=_sample, args=(base, f"s{i}")) for i in range(SAMPLES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        status = httpx.get(base + "/v1/batch", timeout=30).json()
        assert httpx.post(base + "/v1/batch/finish", timeout=30).status_code == 200
        server.join(timeout=120)
    assert codes == [0]
    store = Store(db)
    row = store.list_batches()[-1]
    scheduling = row.config["scheduling"]
    switches = scheduling["choice"]["switches"]
    assert switches and switches[0]["from"] == SLOW.name and scheduling["policy"] == switches[-1]["to"] != SLOW.name
    assert scheduling["choice"]["replan"]["checkpoints"] >= 1
    assert status["policy"]["name"] == switches[-1]["to"] and status["policy"]["chosen"] == SLOW.name
    samples = store.samples(row.id)
    assert len(samples) == SAMPLES and all(s.status == "completed" for s in samples)
    spans = [(s.admitted_at, s.finished_at) for s in samples]
    assert max_overlap(spans) >= 2  # SLOW admits one at a time


def _sample(base: str, key: str) -> None:
    """One sample of the harness: REQUESTS chat completions in a row, then its end."""
    with httpx.Client(base_url=base, timeout=300, headers={"X-Agentbatch-Sample": key}) as client:
        for _ in range(REQUESTS):
            body = {"model": MODEL, "max_tokens": 96, "messages": [{"role": "user", "content": f"{key} go on"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert client.post(f"/v1/samples/{key}/finish", json={}).status_code == 200
