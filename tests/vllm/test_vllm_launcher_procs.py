"""Launcher process handling against real processes (a stand-in server, so no vLLM is needed):
health wait, endpoints file, clean stop of whole process groups, SIGKILL escalation, start
failures reported with the log tail, `workers up --foreground` stopped by Ctrl-C, `workers list`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from testkit import CLI, wait_until
from vllm_helpers import REPO, fake_config, processes_with

from agentbatch.engines.vllm_workers import (
    WorkerCluster,
    WorkerProcess,
    WorkersError,
    down_from_file,
    group_alive,
    probe,
    read_endpoints,
    read_processes,
    write_endpoints,
)


def test_up_writes_endpoints_and_down_stops_every_process(tmp_path):
    cfg = fake_config(tmp_path, count=2, env={"FAKE_CHILD": "1"})
    cluster = WorkerCluster(cfg)
    endpoints = cluster.up()
    try:
        assert [e.name for e in endpoints] == ["vllm-0", "vllm-1"]
        assert read_endpoints(cfg.endpoints_file) == endpoints
        for ep in endpoints:
            info = probe(ep.base_url)
            assert info["healthy"] and info["models"] == ["fake-model"]
        pgids = [w.pgid for w in cluster.workers]
        assert all(group_alive(g) for g in pgids)
        assert len(processes_with("signal.SIG_IGN); time.sleep(600)")) >= 2  # the grandchildren
    finally:
        # The grandchildren ignore SIGTERM: down must escalate to SIGKILL for the whole group.
        result = cluster.down()
    assert set(result.values()) <= {"stopped", "killed"} and len(result) == 2
    assert not any(group_alive(g) for g in pgids)
    # no fake server left in those groups (by group id: other tests' servers may run beside these)
    assert not [pid for pid, _ in processes_with("vllm_fake_server") if _group(pid) in pgids]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_endpoints_file_appears_last_and_whole(tmp_path, monkeypatch):
    """Whoever waits for the endpoints file (`workers down`, a harness) finds the process file
    complete beside it and never a half-written file."""
    workers = [WorkerProcess(f"vllm-{i}", 100 + i, 100 + i, 8000 + i, f"/logs/{i}", f"http://h:{8000 + i}/v1", "m",
                             ["serve"]) for i in range(2)]
    target = tmp_path / "endpoints.json"
    seen: list[str] = []
    real_replace = os.replace

    def watching_replace(src, dst):  # every file the writer makes visible, in order
        if Path(dst) == target:
            assert [p.pid for p in read_processes(target)] == [100, 101]  # the sidecar is already whole
        seen.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watching_replace)
    write_endpoints(target, workers)
    assert seen == ["endpoints.json.procs.json", "endpoints.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == seen[::-1]  # no temporary file left
    assert [e.name for e in read_endpoints(target)] == ["vllm-0", "vllm-1"]


def test_down_from_file_stops_workers_started_elsewhere(tmp_path):
    cfg = fake_config(tmp_path, count=1, env={"FAKE_IGNORE_TERM": "1"})
    cluster = WorkerCluster(cfg)
    cluster.up()
    pgid = cluster.workers[0].pgid
    result = down_from_file(cfg.endpoints_file, timeout_s=1.0)
    cluster._procs[cluster.workers[0].name].wait(timeout=10)  # reap: we are its parent here
    assert result == {"vllm-0": "killed"}  # it ignored SIGTERM
    assert not group_alive(pgid)
    # A second down finds nothing to stop and says so.
    with pytest.raises(WorkersError, match="no process file"):
        down_from_file(cfg.endpoints_file)


def test_a_worker_that_dies_at_start_is_reported_with_its_log(tmp_path):
    cfg = fake_config(tmp_path, count=2, env={"FAKE_FAIL": "ValueError: no model at fake-model"})
    cluster = WorkerCluster(cfg)
    with pytest.raises(WorkersError) as err:
        cluster.up()
    msg = str(err.value)
    assert "exited with code 3" in msg and "ValueError: no model at fake-model" in msg
    assert cluster.workers == []  # the other one was stopped too
    assert not processes_with(str(tmp_path / "logs"))


def test_a_worker_that_is_never_healthy_times_out(tmp_path):
    cfg = fake_config(tmp_path, count=1, env={"FAKE_DELAY_S": "30"}, startup_timeout_s=1.5)
    cluster = WorkerCluster(cfg)
    with pytest.raises(WorkersError, match=r"not healthy after 2 s"):
        cluster.up()
    assert not processes_with(f"--port {cfg.workers[0].port}")


def _cli(*args: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def test_cli_up_foreground_stops_on_ctrl_c_and_list_reports(tmp_path):
    cfg = fake_config(tmp_path, count=2)
    cfg_path = tmp_path / "workers.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump()))
    proc = _cli("workers", "up", str(cfg_path), "--foreground")
    try:
        # `up` writes the process file first and the endpoints file last, each whole: once the
        # endpoints file exists, both are complete.
        wait_until(lambda: os.path.exists(cfg.endpoints_file), 60, "the endpoints file",
                   alive=lambda: proc.poll() is None)
        procs = json.loads((tmp_path / "endpoints.json.procs.json").read_text())
        listed = subprocess.run([*CLI, "workers", "list", "--json", cfg.endpoints_file], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        rows = json.loads(listed.stdout)
        assert [r["healthy"] for r in rows] == [True, True] and rows[0]["models"] == ["fake-model"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "vllm-0: stopped" in out and "vllm-1: stopped" in out
    assert not any(group_alive(p["pgid"]) for p in procs)


def test_cli_list_of_a_dead_url_fails():
    r = subprocess.run([*CLI, "workers", "list", "http://127.0.0.1:9/"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "DOWN" in r.stdout
