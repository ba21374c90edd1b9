"""Findings 2, 3 and 10: failed samples, scorer errors, a blocking tool, --fail-on-error, retry.

- A scorer that raises fails its sample only (the batch goes on, status completed_with_failures);
  one that raises once is retried like an environment step and the sample completes.
- A tool that blocks synchronously (time.sleep) in an environment declaring `blocking` runs in a
  worker thread: the other samples keep completing steps meanwhile; the step timeout fails the
  step without waiting for the thread.
- An engine server that dies mid-batch leaves failed samples; once it is back, `agentbatch retry`
  runs exactly those again, from their last completed step, and the batch ends `completed`.
- `--fail-on-error` stops the batch (status failed, exit 1) once its limit is passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config, cli_env, completions, duplicates, run_cli, write_config
from testkit import CLI, answers, free_port, run_cli_here, wait_until

from agentbatch.db.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
HERE = Path(__file__).parent


def faulty_config(name: str, limit: int, **faults: object) -> dict:
    cfg = bfcl_config(name, limit=limit, scale=0.2)
    cfg["workload"] = {"kind": "reliability_workloads:FaultyBfcl", "params": {"limit": limit, "seed": 11, **faults}}
    return cfg


def run_with_faults(args: list[str], db_url: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """In a process of its own: its blocking tools' threads end with it (asyncio.run would wait for
    them at exit in the test's process)."""
    env = cli_env(db_url, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_scorer_errors_fail_their_sample_not_the_batch(tmp_path: Path, sqlite_url: str) -> None:
    cfg = faulty_config("scorer", 6, score_errors=1, score_flaky=1)
    cfg["retries"] = {"environment": 2, "inference": 2, "backoff_s": 0.05}
    done = run_cli_here(["run", str(write_config(tmp_path, cfg)), "--no-progress"], sqlite_url)
    assert done.returncode == 1, done.stdout + done.stderr  # one sample failed: exit 1, no crash
    assert "Traceback" not in done.stdout + done.stderr
    store = Store(sqlite_url)
    batch = store.list_batches()[0]
    samples = store.samples(batch.id)
    assert batch.status == "completed_with_failures"
    failed = [s for s in samples if s.status == "failed"]
    assert len(failed) == 1 and "scoring failed after 3 attempt(s)" in (failed[0].error or "")
    assert sum(s.status == "completed" for s in samples) == 5  # the flaky scorer's sample included
    store.close()


def test_all_samples_failed_means_batch_failed(tmp_path: Path, sqlite_url: str) -> None:
    cfg = faulty_config("allfail", 3, score_errors=3)
    cfg["retries"] = {"environment": 0, "inference": 0, "backoff_s": 0.05}
    done = run_cli_here(["run", str(write_config(tmp_path, cfg)), "--no-progress"], sqlite_url)
    assert done.returncode == 1, done.stdout + done.stderr
    store = Store(sqlite_url)
    assert store.list_batches()[0].status == "failed"
    store.close()


def test_fail_on_error_stops_the_batch(tmp_path: Path, sqlite_url: str) -> None:
    cfg = faulty_config("stop", 10, score_errors=4)
    cfg["retries"] = {"environment": 0, "inference": 0, "backoff_s": 0.05}
    cfg["scheduling"]["max_active_samples"] = 1  # one at a time: the stop leaves samples unrun
    done = run_cli_here(["run", str(write_config(tmp_path, cfg)), "--no-progress", "--fail-on-error", "1"],
                        sqlite_url)
    assert done.returncode == 1, done.stdout + done.stderr
    store = Store(sqlite_url)
    batch = store.list_batches()[0]
    counts = store.status_counts(batch.id)
    assert batch.status == "failed" and "fail-on-error" in (batch.error or "")
    assert counts.get("failed") == 2 and counts.get("completed", 0) < 8  # stopped at the 2nd failure
    within = run_cli_here(["resume", str(batch.id), "--no-progress", "--fail-on-error", "0.5"], sqlite_url)
    assert within.returncode == 0, within.stdout + within.stderr  # 4 of 10 failed: within 50 %
    assert store.get_batch(batch.id).status == "completed_with_failures"
    bad = run_cli_here(["resume", str(batch.id), "--fail-on-error", "lots"], sqlite_url)
    assert bad.returncode == 2 and "--fail-on-error" in bad.stderr
    store.close()


def _block_marks(marks: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in marks.glob("*.json")}


def test_blocking_tool_does_not_stall_other_samples(tmp_path: Path, sqlite_url: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = faulty_config("blocking", 6, block_tasks=1, block_s=8.0, blocking=True, marks_dir=str(marks))
    cfg["engine"]["params"]["timing"]["scale"] = 1.0  # the other samples still run when the tool blocks
    cfg["scheduling"] = {"max_active_samples": 6, "env_slots": 6, "per_worker_inflight": 4}
    done = run_with_faults(["run", str(write_config(tmp_path, cfg)), "--no-progress"], sqlite_url)
    assert done.returncode == 0, done.stdout + done.stderr
    (task_id, window), = _block_marks(marks).items()
    store = Store(sqlite_url)
    batch_id = store.list_batches()[0].id
    blocked = {s.id for s in store.samples(batch_id) if s.task_id == task_id}
    during = [st for st in store.steps(batch_id)
              if st.sample_id not in blocked and st.status == "completed"
              and window["start"] < st.finished_at < window["end"]]
    # on the flow's event loop the 8 s sleep froze every sample: no other step could finish
    assert len(during) >= 5, f"only {len(during)} steps of other samples finished while the tool blocked"
    store.close()


def test_step_timeout_ends_a_blocked_step(tmp_path: Path, sqlite_url: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = faulty_config("timeout", 3, block_tasks=1, block_s=60.0, blocking=True, marks_dir=str(marks))
    cfg["limits"] = {"step_timeout_s": 1.0}
    cfg["retries"] = {"environment": 0, "inference": 0, "backoff_s": 0.05}
    done = run_with_faults(["run", str(write_config(tmp_path, cfg)), "--no-progress"], sqlite_url, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    store = Store(sqlite_url)
    batch = store.list_batches()[0]
    failed = [s for s in store.samples(batch.id) if s.status == "failed"]
    assert len(failed) == 1 and "timed out" in (failed[0].error or "")
    assert batch.status == "completed_with_failures"
    # The batch did not wait for the 60 s tool: it ended within 60 s of that step's start (not of the
    # test's: starting the CLI takes its own time on a loaded machine).
    blocked = min(st.started_at for st in store.steps(batch.id) if st.sample_id == failed[0].id
                  and st.kind == "environment")
    assert batch.finished_at < blocked + 60
    store.close()


def _serve_sim(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*CLI, "serve-sim", "--profile", "tiny-cpu", "--port", str(port), "--time-scale", "0.2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 120, "serve-sim",
                   alive=lambda: proc.poll() is None)
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc


def _completed(store: Store) -> int:
    batches = store.list_batches()
    return store.status_counts(batches[0].id).get("completed", 0) if batches else 0


def _run_and_kill_engine(tmp_path: Path, store: Store, sqlite_url: str, port: int,
                         server: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:
    """Run a 12-sample batch against serve-sim; SIGKILL the server once 3 samples completed."""
    cfg = bfcl_config("engine-dies", limit=12)
    cfg["engine"] = {"kind": "openai", "params": {"endpoints": [
        {"name": "sim-0", "base_url": f"http://127.0.0.1:{port}/v1", "model": "tiny-cpu"}]}}
    cfg["scheduling"] = {"max_active_samples": 2, "env_slots": 2, "per_worker_inflight": 2}
    cfg["retries"] = {"environment": 1, "inference": 1, "backoff_s": 0.1}
    args = [*CLI, "run", str(write_config(tmp_path, cfg)), "--no-progress"]
    run = subprocess.Popen(args, env=cli_env(sqlite_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with contextlib.suppress(AssertionError):  # the run ending first shows in the assertions after
        wait_until(lambda: _completed(store) >= 3, 300, "3 completed samples", alive=lambda: run.poll() is None)
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    out = run.communicate(timeout=600)[0]
    return subprocess.CompletedProcess(args, run.returncode, out, "")


def test_engine_dies_then_retry_runs_only_the_failed_samples(tmp_path: Path, sqlite_url: str) -> None:
    port = free_port()
    store = Store(sqlite_url)
    first = _run_and_kill_engine(tmp_path, store, sqlite_url, port, _serve_sim(port))
    assert first.returncode == 1, first.stdout
    batch_id = store.list_batches()[0].id
    failed_ids = {s.id for s in store.samples(batch_id) if s.status == "failed"}
    assert failed_ids and store.get_batch(batch_id).status in ("completed_with_failures", "failed")
    before = completions(store, batch_id)
    finished_before = {s.id: s.finished_at for s in store.samples(batch_id) if s.status == "completed"}

    server = _serve_sim(port)  # the engine is back
    try:
        retried = run_cli(["retry", str(batch_id), "--no-progress"], sqlite_url)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert f"retrying {len(failed_ids)} failed sample(s)" in retried.stdout
    samples = {s.id: s for s in store.samples(batch_id)}
    assert all(s.status == "completed" for s in samples.values())
    assert store.get_batch(batch_id).status == "completed"
    # completed samples were not run again; each failed one was retried once
    assert all(samples[sid].finished_at == t and samples[sid].retries == 0 for sid, t in finished_before.items())
    assert all(samples[sid].retries == 1 for sid in failed_ids)
    after = completions(store, batch_id)
    assert duplicates(store, batch_id) == {} and all(after[k] == v for k, v in before.items())
    store.close()
