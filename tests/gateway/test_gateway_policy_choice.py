"""`scheduling.policy: auto` for a gateway batch: it chooses by simulating the portfolio on the
earlier finished batches of the same name (the suite's history), with the samples sent as the harness
sends them; the batch records and runs the choice, a process joining the batch runs the batch's
stored scheduling, and without history or an engine model the configured policy runs."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import httpx
import yaml
from gateway_helpers import MODEL, sim_workers
from testkit import CLI, answers, free_port, wait_until

from agentbatch.dashboards.choice import running_policy
from agentbatch.db.store import Store
from agentbatch.db.trace_io import import_trace
from agentbatch.flows.commands._gateway_processes import served_config
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.policy_choice import apply_candidate, choose_gateway_policy, harness_concurrency
from agentbatch.scheduling.portfolio import running_policy_status
from agentbatch.sim.portfolio import portfolio
from agentbatch.traces import generate

NAME = "gw-suite"
TIMING = {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 0.25}


def _config(endpoints: list[dict], **scheduling: object) -> BatchConfig:
    return BatchConfig.model_validate({"name": NAME, "scheduling": scheduling, "engine": {
        "kind": "openai", "params": {"endpoints": endpoints, "timing": TIMING}}})


def _opened(trace, spans: list[tuple[float, float]]):  # noqa: ANN001, ANN202
    trace.samples = [replace(s, admitted_at=a, finished_at=f) for s, (a, f) in zip(trace.samples, spans, strict=True)]
    return trace


def test_the_harness_concurrency_is_the_peak_of_open_samples_below_the_admission_limit() -> None:
    two = _opened(generate("mcp_like", 4, seed=1), [(0, 5), (0, 3), (3, 9), (5, 9)])
    assert harness_concurrency([two]) == 2  # an end and a start at one instant: still two open
    three = _opened(generate("mcp_like", 4, seed=2), [(0, 5), (1, 6), (2, 7), (8, 9)])
    assert harness_concurrency([two, three]) == 3
    three.meta["config"] = {"scheduling": {"max_active_samples": 3}}
    assert harness_concurrency([three]) is None  # it reached the limit: the harness may have sent more
    assert harness_concurrency([two, three]) == 3  # at least 3 (the limit), and 2 shown below a limit
    two.meta["config"] = {"scheduling": {"max_active_samples": 2}}
    assert harness_concurrency([two, three]) is None  # both reached their limits
    assert harness_concurrency([generate("mcp_like", 4, seed=1)]) is None  # no admission times


def _history(store: Store, runs: int = 3) -> None:
    for seed in range(1, runs + 1):
        trace = _opened(generate("mcp_like", 6, seed=seed), [(0, 40), (0, 50), (40, 90), (50, 80), (80, 120), (90, 130)])
        import_trace(store, trace, name=NAME)
    import_trace(store, generate("swe_like", 6, seed=9), name="another suite")


def test_auto_simulates_the_earlier_batches_of_its_name_with_the_harness_window(sqlite_url) -> None:
    store = Store(sqlite_url)
    _history(store)
    config = _config([{"name": "w0", "base_url": "http://127.0.0.1:9/v1", "model": MODEL}], env_slots=4)
    choice = choose_gateway_policy(config, store, 1)
    s = choice.summary
    assert s["mode"] == "auto" and s["members"] == 3 and s["harness"] == 2  # two open at once in the history
    assert s["chosen"] == choice.config.scheduling.policy
    # it re-plans with the six samples of the history expected, sent through the harness's window
    assert choice.plan is not None and choice.plan.expected == 6 and choice.plan.base.harness == 2
    chosen = next(c for c in portfolio() if c.name == s["chosen"])
    expected = apply_candidate(config, chosen, 6).scheduling.model_dump(exclude={"choice"})
    assert choice.config.scheduling.model_dump(exclude={"choice"}) == expected
    assert choose_gateway_policy(config, store, 1, harness=5).summary["harness"] == 5


def test_without_history_or_engine_model_the_configured_policy_runs_and_says_why(sqlite_url) -> None:
    store = Store(sqlite_url)
    config = _config([{"name": "w0", "base_url": "http://127.0.0.1:9/v1", "model": MODEL}])
    none = choose_gateway_policy(config, store, 1)
    assert none.config == config and "no earlier finished batch named 'gw-suite'" in none.summary["reason"]
    _history(store)
    bare = config.model_copy(update={"engine": config.engine.model_copy(update={"params": {
        "endpoints": config.engine.params["endpoints"]}})})
    assert "no simulated timing profile" in choose_gateway_policy(bare, store, 1).summary["reason"]
    pinned = config.model_copy(update={"scheduling": config.scheduling.model_copy(update={"policy": "configured"})})
    assert choose_gateway_policy(pinned, store, 1).summary == {"mode": "configured", "chosen": "configured"}


def test_a_process_joining_the_batch_runs_its_stored_scheduling(sqlite_url) -> None:
    store = Store(sqlite_url)
    _history(store)
    config = _config([{"name": "w0", "base_url": "http://127.0.0.1:9/v1", "model": MODEL}])
    opened, choice, _ = served_config(config, store, 1, {})
    assert choice is not None and opened.scheduling.policy == choice["chosen"]
    batch_id = store.create_batch(NAME, opened.model_dump(mode="json"), [])
    joined, again, plan = served_config(config, store, 1, {"batch": batch_id})
    assert again is None and plan is None and joined.scheduling == opened.scheduling  # it does not re-plan


def test_the_gateway_command_records_and_reports_the_choice(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    _history(Store(db))
    port = free_port()
    with sim_workers(1) as workers:
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({"name": NAME, "engine": {"kind": "openai", "params": {
            "endpoints": [{"name": "w0", "base_url": workers[0].base_url, "model": MODEL}], "timing": TIMING}}}))
        argv = ["--config", str(path), "--db", db, "--port", str(port), "--harness-concurrency", "3"]
        out, status = _serve_one_request(argv, port)
    batch = Store(db).list_batches()[-1]
    choice = batch.config["scheduling"]["choice"]
    assert batch.name == NAME and choice["mode"] == "auto" and choice["harness"] == 3 and choice["members"] == 3
    assert batch.config["scheduling"]["policy"] == choice["chosen"]
    assert f"auto chose {choice['chosen']}" in out and "3 samples at a time" in out
    assert f"policy {choice['chosen']!r}, chosen by policy auto (" in out  # said when the gateway opens
    assert status["policy"] == {"name": choice["chosen"], "by": "auto", "chosen": choice["chosen"], "harness": 3,
                                "simulations": choice["simulations"], "members": 3}  # and by GET /v1/batch


def test_the_running_policy_is_read_from_the_stored_config() -> None:
    choice = {"mode": "auto", "chosen": "defaults", "candidates": [], "simulations": 9, "members": 3, "harness": 4}
    chosen = {"scheduling": {"policy": "defaults", "choice": choice}}
    assert running_policy_status(chosen) == {"name": "defaults", "by": "auto", "chosen": "defaults",
                                             "simulations": 9, "members": 3, "harness": 4}
    switched = {"scheduling": {"policy": "decoupled FIFO, all admitted", "choice": choice}}  # re-planning switched
    assert running_policy_status(switched)["name"] == "decoupled FIFO, all admitted"
    assert running_policy_status({"scheduling": {"policy": "auto"}}) == {"name": "configured", "by": "fallback"}
    assert running_policy_status({"scheduling": {"policy": "configured"}}) == {"name": "configured", "by": "config"}
    assert running_policy_status({"scheduling": {"policy": "defaults"}}) == {"name": "defaults", "by": "config"}
    assert running_policy({"scheduling": {"policy": "auto"}}).endswith("(policy auto could not choose: the log says why)")
    assert running_policy(chosen).startswith("'defaults', chosen by policy auto (9 simulations on 3 earlier run(s)")



def _serve_one_request(argv: list[str], port: int) -> tuple[str, dict]:
    """`agentbatch gateway ARGV` until one request has been answered and the batch finished; its output
    and what GET /v1/batch said before the finish."""
    proc = subprocess.Popen([*CLI, "gateway", *argv, "--no-prefect", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(base + "/health"), 120, "the gateway", alive=lambda: proc.poll() is None)
        body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(base + "/v1/chat/completions", headers={"X-Agentbatch-Sample": "t1"}, json=body,
                          timeout=60).status_code == 200
        status = httpx.get(base + "/v1/batch", timeout=60).json()
        assert httpx.post(base + "/v1/batch/finish", timeout=60).status_code == 200
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    return out, status
