"""`agentbatch gateway`: bad input exits 2 with nothing written; SIGTERM ends the batch cleanly; a
gateway batch compares with a built-in batch of the same tasks in `agentbatch report --compare`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from gateway_helpers import (
    MODEL,
    BfclHarnessEnv,
    gateway_config,
    ground_truth_policy,
    serve_gateway,
    sim_workers,
)
from openai import AsyncOpenAI
from plain_openai_harness import run_sample
from testkit import CLI, answers, free_port, wait_until

from agentbatch.db.store import Store
from agentbatch.environments.bfcl import BfclWorkload
from agentbatch.flows.batch import create_batch, execute_batch
from agentbatch.flows.cli import main as cli_main
from agentbatch.flows.config import BatchConfig


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("config", "extra", "expected"), [
    ({"engine": {"kind": "scripted"}}, [], "engine.kind"),
    ({"engine": {"kind": "openai", "params": {"endpoints": []}}}, [], "endpoints"),
    ({"scheduling": {"env_slots": 0}}, [], "scheduling.env_slots"),
    ({"engine": {"kind": "openai", "params": {"endpoints": [{"base_url": "http://h/v1", "model": "m"}]}}},
     ["--mcp", "no-equals-sign"], "--mcp"),
    ({"engine": {"kind": "openai", "params": {"endpoints": [{"base_url": "http://h/v1", "model": "m"}]}}},
     ["--port", "70000"], "--port"),
    ({"engine": {"kind": "openai", "params": {"endpoints": [{"base_url": "http://h/v1", "model": "m"}]}}},
     ["--mcp", "a=http://h/mcp", "--mcp-per-sample", "b"], "--mcp-per-sample: b not among"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, config, extra, expected):
    db = tmp_path / "store.sqlite"
    path = write_config(tmp_path / "gw.yaml", config)
    code = cli_main(["gateway", "--config", str(path), "--db", f"sqlite:///{db}", "--no-prefect", *extra])
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not db.exists()


def test_help_explains_the_options(capsys):
    with pytest.raises(SystemExit):
        cli_main(["gateway", "--help"])
    out = capsys.readouterr().out
    assert "--mcp" in out and "/v1/batch/finish" in out and "default: 300.0" in out


def test_sigterm_ends_the_batch_cleanly(tmp_path):
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    port = free_port()
    with sim_workers(1) as endpoints:
        path = write_config(tmp_path / "gw.yaml", {
            "name": "cli-gw", "engine": {"kind": "openai", "params": {"endpoints": [
                {"name": "w0", "base_url": endpoints[0].base_url, "model": MODEL, "api_key": "sk-secret-123"}]}}})
        proc = subprocess.Popen(
            [*CLI, "gateway", "--config", str(path), "--db", db,
             "--port", str(port), "--no-prefect", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: answers(base + "/health"), 120, "the gateway", alive=lambda: proc.poll() is None)
            r = httpx.post(base + "/v1/chat/completions", headers={"X-Agentbatch-Sample": "t1"}, timeout=60,
                           json={"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out
    assert "OpenAI base URL" in out and "1/1 completed" in out
    assert "policy the configured scheduling (policy auto could not choose" in out  # no engine timing profile
    store = Store(db)
    (batch,) = store.list_batches()
    assert batch.status == "completed" and batch.name == "cli-gw"
    assert "sk-secret-123" not in str(batch.config) and "sk-secret-123" not in out  # never stored or printed
    (step,) = store.steps(batch.id)
    assert step.status == "completed" and step.output_tokens == 3


def test_report_compares_a_gateway_batch_with_a_built_in_batch(sqlite_url, tmp_path, capsys):
    workload = BfclWorkload(categories=["multi_turn_base"], limit=6, seed=3)
    task_ids = [t.task_id for t in workload.tasks()]
    store = Store(sqlite_url)
    builtin = BatchConfig.model_validate({"name": "built-in", "workload": {
        "kind": "bfcl", "params": {"task_ids": task_ids}}, "engine": {"kind": "scripted"}})
    builtin_id = create_batch(builtin, store)
    asyncio.run(execute_batch(store, builtin_id, use_prefect=False, show_progress=False))
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints), endpoints) as gw:

            async def drive() -> None:
                client = AsyncOpenAI(base_url=gw.base_url + "/v1", api_key="unused")
                for task_id in task_ids:
                    env = BfclHarnessEnv(task_id)
                    await run_sample(client, MODEL, task_id, env, ground_truth_policy(workload, task_id))
                    await client.post(f"/samples/{task_id}/finish", cast_to=object, body={"score": await env.score()})
                await client.close()

            asyncio.run(drive())
            gateway_id = gw.batch_id
    code = cli_main(["report", str(gateway_id), "--compare", str(builtin_id), "--db", sqlite_url,
                     "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "cmp" / "index.html").exists()
    assert f"batch {gateway_id}" in out and f"batch {builtin_id}" in out
    assert {s.score for s in store.samples(gateway_id)} == {1.0}


@pytest.mark.postgres
def test_store_password_is_neither_printed_nor_a_flow_run_parameter(tmp_path, pg_url, prefect_api):
    """`agentbatch gateway --db URL-with-password` as a Prefect flow run: the password is not in its
    output, and the flow run's parameters name the store without it."""
    import json

    from sqlalchemy.engine import make_url

    password = make_url(pg_url).password
    assert password
    port = free_port()
    with sim_workers(1) as endpoints:
        path = write_config(tmp_path / "gw.yaml", {"name": "gw-secret", "engine": {"kind": "openai", "params": {
            "endpoints": [{"name": "w0", "base_url": endpoints[0].base_url, "model": MODEL}]}}})
        proc = subprocess.Popen([*CLI, "gateway", "--config", str(path), "--db", pg_url, "--port", str(port),
                                 "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "PREFECT_API_URL": prefect_api})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: answers(base + "/health"), 180, "the gateway", alive=lambda: proc.poll() is None)
            assert httpx.post(base + "/v1/batch/finish").status_code == 200
            out, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out
    assert f":{password}@" not in out and pg_url not in out
    runs = httpx.post(f"{prefect_api}/flow_runs/filter", json={"limit": 200}, timeout=30).json()
    mine = [r for r in runs if str(path) == r["parameters"].get("config_path")]
    assert mine, [r["name"] for r in runs]
    assert all(f":{password}@" not in json.dumps(r["parameters"]) for r in mine)
    assert make_url(mine[0]["parameters"]["db_url"]).database == make_url(pg_url).database  # names the store
