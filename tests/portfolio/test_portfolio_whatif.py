"""`agentbatch whatif`: a batch recorded live on two `agentbatch serve-sim` HTTP workers (processes),
replayed in virtual time with the runner's measured costs. The prediction of the same configuration
is near the recorded makespan: the bound here is 20 %, because on a shared machine under load the
runner's own cost per step (measured: 0.45-0.6 s a step at load 15-18, against ~10 ms on a quiet
one) is most of a step and swings during the run; without those costs the prediction was 0.46x the
recording. A change of slots or policy is predicted beside it; bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import answers, free_port, wait_until

from agentbatch.db.store import Store
from agentbatch.flows.cli import main as cli
from agentbatch.traces import generate, write_trace

SCALE = 0.25  # the workers and the recorded tool durations run at a quarter of real time


@pytest.fixture(scope="module")
def live_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    tmp = tmp_path_factory.mktemp("whatif")
    trace = tmp / "mcp.parquet"
    write_trace(generate("mcp_like", 10, seed=4), trace)
    db = f"sqlite:///{tmp / 'store.sqlite'}"
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "agentbatch.flows.cli", "serve-sim", "--profile", "llama3-8b-h100",
                               "--time-scale", str(SCALE), "--port", str(port), "--workers-name", f"sim-{i}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i, port in enumerate(ports)]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_until(lambda p=port: answers(f"http://127.0.0.1:{p}/health"), 120, "serve-sim health",
                       alive=lambda pr=proc: pr.poll() is None)
        argv = ["replay", str(trace), "--mode", "live", "--engine", "openai", "--model", "llama3-8b-h100",
                "--time-scale", str(SCALE), "--env-slots", "3", "--max-active", "10", "--admission-control", "static",
                "--db", db]
        for port in ports:
            argv += ["--endpoint", f"http://127.0.0.1:{port}/v1"]
        assert cli(argv) == 0
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    [batch] = Store(db).list_batches()
    return db, batch.id


def test_the_same_configuration_is_predicted_near_the_recorded_makespan(live_batch, capsys) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    assert cli(["whatif", str(batch_id), "--time-scale", str(SCALE), "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == 2 and out["env_slots"] == 3
    assert out["runner_step_cost_s"] > 0  # measured from the recorded steps
    assert out["predicted_same_s"] == pytest.approx(out["recorded_makespan_s"], rel=0.20)


def test_fewer_slots_and_another_policy_are_predicted_beside_it(live_batch, capsys) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    assert cli(["whatif", str(batch_id), "--time-scale", str(SCALE), "--env-slots", "1", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "predicted, with 1 environment slots" in text and "recorded makespan" in text
    assert cli(["whatif", str(batch_id), "--time-scale", str(SCALE), "--env-slots", "1", "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_changed_s"] > out["predicted_same_s"]  # one slot for every tool call: slower
    assert cli(["whatif", str(batch_id), "--time-scale", str(SCALE), "--policy", "coupled at slots (paper)",
                "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["change"] == "policy 'coupled at slots (paper)'" and out["predicted_changed_s"] > 0


def test_bad_input_exits_2(live_batch, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    assert cli(["whatif", "999", "--db", db]) == 2
    assert "no batch 999" in capsys.readouterr().err
    assert cli(["whatif", str(batch_id), "--policy", "nope", "--db", db]) == 2
    assert "not in the portfolio" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli(["whatif", str(batch_id), "--env-slots", "0", "--db", db])
    assert exc.value.code == 2
    assert cli(["whatif", "1", "--policy", "list"]) == 0
    assert "decoupled FIFO, all admitted" in capsys.readouterr().out
