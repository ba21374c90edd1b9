"""The example plugin package through the stock CLI: run, kill -9, stock `resume`, `status`, `report`
with `--compare`; scores by group everywhere; the `kind` forms of an installed package."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from testkit import CLI, run_cli_here

from agentbatch.db.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "toolbench_installed")]

TASKS = 6  # per suite


def config(name: str, kind: str, delay_s: float, **extra: object) -> dict:
    return {
        "name": name,
        "workload": {"kind": kind, "params": {"tasks_per_suite": TASKS, "delay_s": delay_s}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0.2}}},
        "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 2},
        **extra,
    }


def completed_once(store: Store, batch_id: int) -> dict[tuple[int, int], int]:
    seen: dict[tuple[int, int], int] = {}
    for st in store.steps(batch_id):
        if st.status == "completed":
            key = (st.sample_id, st.index)
            assert key not in seen, f"step {key} completed twice"
            seen[key] = st.id
    return seen


def cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_example_plugin_run_kill_resume_status_report_compare(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'plugin.sqlite'}"
    env = {**os.environ, "AGENTBATCH_DB_URL": db}
    first = tmp_path / "entry_point.yaml"
    first.write_text(yaml.safe_dump(config("by-entry-point", "toolbench", delay_s=0.25)))
    proc = subprocess.Popen([*CLI, "run", str(first), "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    store = Store(db)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:  # kill once the batch is under way, before it ends
            batches = store.list_batches()
            if batches and len(completed_once(store, batches[0].id)) >= 12:
                break
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.1)
        else:
            pytest.fail("batch did not get going")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    batch_id = store.list_batches()[0].id
    before = completed_once(store, batch_id)
    assert store.status_counts(batch_id).get("completed", 0) < 2 * TASKS, "killed too late to test anything"

    resumed = cli("resume", str(batch_id), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = completed_once(store, batch_id)
    assert all(after[k] == row for k, row in before.items())  # nothing completed ran again
    samples = store.samples(batch_id)
    assert {(s.task_group, s.status, s.score) for s in samples} == {("arith", "completed", 1.0),
                                                                     ("notes", "completed", 1.0)}
    assert "by group      arith 1.000 (6/6); notes 1.000 (6/6)" in resumed.stdout

    # The same benchmark by "module:Object", with the package's policy and engine-free params.
    second = tmp_path / "module_object.yaml"
    second.write_text(yaml.safe_dump(config(
        "by-module-object", "toolbench.workload:ToolBench", delay_s=0.0, execution={"mode": "lean"},
        scheduling={"priority": {"name": "toolbench_fewest_steps", "params": {"ceiling": 50}}})))
    ran = cli("run", str(second), "--no-progress", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    other_id = max(b.id for b in store.list_batches())

    status = cli("status", str(batch_id), env=env)
    assert status.returncode == 0, status.stderr
    assert "score by group arith 1.000 (6/6); notes 1.000 (6/6)" in status.stdout
    assert "plugins       workload toolbench -> toolbench.workload:ToolBench; engine scripted ->" in status.stdout

    out = tmp_path / "report"
    report = cli("report", str(batch_id), "--compare", str(other_id), "--out", str(out), env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"group arith: batch {batch_id} 1.000, batch {other_id} 1.000" in report.stdout
    assert f"group notes: batch {batch_id} 1.000, batch {other_id} 1.000" in report.stdout
    assert "scores agree on 12 task ids" in report.stdout
    assert "workload toolbench.workload:ToolBench; engine scripted" in report.stdout  # resolved as written
    assert "arith" in (out / "index.html").read_text()
    store.close()


def test_plugin_engine_and_unknown_param_through_the_cli(tmp_path: Path) -> None:
    """The package's own engine runs (it never answers right: score 0 by group); a mistyped param
    of the plugin workload exits 2 naming it, before any store exists."""
    db_path = tmp_path / "lazy.sqlite"
    db_url = f"sqlite:///{db_path}"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"workload": {"kind": "toolbench", "params": {"tasks_per_suit": 2}}}))
    refused = run_cli_here(["run", str(bad)], db_url)
    assert refused.returncode == 2 and "workload.params.tasks_per_suit" in refused.stderr
    assert not db_path.exists()

    lazy = tmp_path / "lazy.yaml"
    lazy.write_text(yaml.safe_dump({"name": "lazy", "workload": {"kind": "toolbench", "params": {"tasks_per_suite": 2}},
                                    "engine": {"kind": "toolbench_lazy"}, "execution": {"mode": "lean"}}))
    ran = run_cli_here(["run", str(lazy), "--no-progress"], db_url)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "by group      arith 0.000 (2/2); notes 0.000 (2/2)" in ran.stdout
