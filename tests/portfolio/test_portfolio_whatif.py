"""`agentbatch whatif`: a batch recorded live on two `agentbatch serve-sim` HTTP workers (processes),
replayed in virtual time with the runner's measured costs (its time per step, how it started the
chains). The prediction of the same configuration is within 5 % of the recorded makespan.

The batch runs with history priors (the same tasks' chain lengths, `replay --priors`), as the
defaults do when the tasks ran before: the environment queue then ranks samples by a key fixed
before the batch, which the simulation has too. Without priors CAAS ranks by observed progress and
breaks its ties by attained service, so samples that finish a step together are ordered by
differences of a few milliseconds of live jitter, and the leader keeps leading: live reruns of this
very batch spread 16.5-18.5 s, and no prediction can be within 5 % of each (docs/replay.md). A
change of slots or policy is predicted beside it; bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import answers, free_port, wait_until

from agentbatch.db.store import Store
from agentbatch.flows.cli import main as cli
from agentbatch.sim.virtual_time.runner import start_costs
from agentbatch.traces import Trace, TraceSample, TraceStep, generate, write_trace

SCALE = 0.5  # the workers and the recorded tool durations run at half of real time: a step is long against
# the runner's own time per step, so a loaded machine (the suite's parallel workers) moves the prediction
# less (docs/replay.md: with seven CPU-bound processes beside the run, 0.98-1.00 at 0.5, 1.03-1.04 at 0.25)


@pytest.fixture(scope="module")
def live_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    tmp = tmp_path_factory.mktemp("whatif")
    trace = tmp / "mcp.parquet"
    write_trace(generate("mcp_like", 10, seed=4), trace)  # its own chain lengths are the priors
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
                "--profile", "llama3-8b-h100", "--time-scale", str(SCALE), "--env-slots", "3", "--max-active", "10",
                "--admission-control", "static", "--priors", str(trace), "--db", db]
        for port in ports:
            argv += ["--endpoint", f"http://127.0.0.1:{port}/v1"]
        assert cli(argv) == 0
        assert cli([*argv, "--policy", "auto"]) == 0  # chooses by simulating the workers on the first batch
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    batch, _ = Store(db).list_batches()
    return db, batch.id


def test_the_same_configuration_is_predicted_near_the_recorded_makespan(live_batch, capsys) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    assert cli(["whatif", str(batch_id), "--time-scale", str(SCALE), "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == 2 and out["env_slots"] == 3
    assert out["runner_step_cost_s"] > 0 and out["start_spacing_s"] > 0  # measured from the recorded steps
    assert out["predicted_same_s"] == pytest.approx(out["recorded_makespan_s"], rel=0.05)


def test_auto_chooses_for_openai_workers_described_by_a_profile(live_batch) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    store = Store(db)
    try:
        first, auto = (store.get_batch(i).config for i in (batch_id, batch_id + 1))
    finally:
        store.close()
    # the endpoints' speed is in the engine config, for predictions only; requests went to the endpoints
    assert auto["engine"]["params"]["timing"] == {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": SCALE}
    assert auto["engine"]["params"]["inner"] == "openai" and first["scheduling"]["choice"] is None
    choice = auto["scheduling"]["choice"]
    assert choice["mode"] == "auto" and choice["members"] == 1 and auto["scheduling"]["policy"] == choice["chosen"]
    assert {r["name"] for r in choice["candidates"]} >= {"decoupled FIFO, all admitted", "defaults"}


def test_whatif_reads_the_workers_speed_from_the_engine_config(live_batch, capsys) -> None:  # noqa: ANN001
    db, batch_id = live_batch
    assert cli(["whatif", str(batch_id), "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time_scale"] == SCALE and out["profile"] == "llama3-8b-h100"


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


def test_the_chains_start_as_the_runner_started_them() -> None:
    def sample(i: int, admitted: float, first: float, finished: float) -> TraceSample:
        step = TraceStep(index=0, kind="inference", duration_s=1.0, enqueued_at=first, started_at=first,
                         finished_at=first + 1.0)  # fmt: skip
        return TraceSample(index=i, task_id=f"t{i}", steps=[step], admitted_at=admitted, finished_at=finished)

    # three admitted at the start stamp their admissions 0.1 s apart but queue their first steps
    # 2 ms apart after 0.5 s of start-up; two admitted later (slots freed at 5 and 6 s) start 30 ms after
    trace = Trace(samples=[sample(0, 0.0, 0.500, 5.0), sample(1, 0.1, 0.502, 6.0), sample(2, 0.2, 0.504, 9.0),
                           sample(3, 5.0, 5.030, 9.0), sample(4, 6.0, 6.030, 9.0)])  # fmt: skip
    start = start_costs(trace)
    assert start.spacing_s == pytest.approx(0.002) and start.latency_s == pytest.approx(0.030)
    assert start.offset_s == pytest.approx(0.500 - 0.030 - 0.002)
