"""The first five minutes, through the real CLI in subprocesses: a small `make demo` equivalent
(the demo config, its store under runs/), then `agentbatch status` exactly as the run printed it,
from another directory; progress in the log; what the Prefect UI shows (flow-run name, tags,
forwarded logs, artifact keys per store); `--quiet`."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ux_demo")]  # one demo run for the module


def cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTBATCH_DB_URL", "AGENTBATCH_DB_PATH")}
    return subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@dataclass
class DemoRun:
    workdir: Path
    out: str
    err: str


@pytest.fixture(scope="module")
def demo(prefect_api, tmp_path_factory) -> DemoRun:
    """`make demo` with 3 samples at 1/20 of the simulated time: same config, same --db and --report."""
    work = tmp_path_factory.mktemp("demo")
    config = yaml.safe_load((ROOT / "examples" / "bfcl_demo.yaml").read_text())
    config["workload"]["params"]["limit"] = 3
    config["engine"]["params"]["timing"]["time_scale"] = 0.05
    (work / "examples").mkdir()
    (work / "examples" / "bfcl_demo.yaml").write_text(yaml.safe_dump(config))
    (work / "runs").mkdir()
    r = cli(["run", "examples/bfcl_demo.yaml", "--db", "sqlite:///runs/demo.sqlite", "--report", "runs/demo-report"],
            cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return DemoRun(work, r.stdout, r.stderr)


def printed_command(out: str, label: str) -> list[str]:
    m = re.search(rf"^\s+{label}:\s+agentbatch (.+)$", out, re.M)
    assert m, f"no '{label}:' command in:\n{out}"
    return shlex.split(m.group(1))


def test_status_with_the_printed_command(demo, tmp_path):
    status = printed_command(demo.out, "watch")
    assert status[:2] == ["status", "1"] and "--db" in status
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli(status, cwd=elsewhere)  # another directory: the printed URL is absolute
    assert r.returncode == 0, r.stderr
    assert "batch 1 (bfcl-demo): completed" in r.stdout and "3/3 done" in r.stdout
    # Neither the run nor the read-only command created a store in the working directory.
    assert not (demo.workdir / "agentbatch.sqlite").exists() and not (elsewhere / "agentbatch.sqlite").exists()
    report = printed_command(demo.out, "report")
    r = cli(report, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "reports" / "batch-1" / "index.html").is_file()


def test_progress_in_the_log_and_heartbeat(demo):
    # stderr is a pipe, not a terminal: one-line progress records instead of a bar.
    lines = [line for line in demo.err.splitlines() if "agentbatch.progress" in line]
    assert lines and "batch 1: 3/3 samples" in lines[-1] and "steps/s" in lines[-1]
    assert re.search(r"active \d+/24, env \d+/6", lines[-1])
    with sqlite3.connect(demo.workdir / "runs" / "demo.sqlite") as conn:
        started, beat = conn.execute("select started_at, heartbeat_at from batches").fetchone()
    assert beat is not None and beat >= started


def test_prefect_shows_the_batch(demo, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    from agentbatch.dashboards.artifacts import store_tag

    with sqlite3.connect(demo.workdir / "runs" / "demo.sqlite") as conn:
        (run_id,) = conn.execute("select flow_run_id from batches where id = 1").fetchone()
    tag = store_tag(f"sqlite:///{(demo.workdir / 'runs' / 'demo.sqlite').resolve()}")  # relative = absolute

    async def read():  # type: ignore[no-untyped-def]
        async with get_client() as c:
            fr = await c.read_flow_run(run_id)
            logs = await c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])))
            tasks = await c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id])))
            arts = await c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
                any_=[fr.id])))
            return fr, logs, tasks, arts

    fr, logs, tasks, arts = asyncio.run(read())
    assert fr.name == "batch-1-bfcl-demo" and fr.state.is_completed()
    assert {"agentbatch", "batch-1", f"store-{tag}"} <= set(fr.tags)
    assert any(log.name == "agentbatch.progress" and "3/3 samples" in log.message for log in logs)
    # task runs carry no tags (each tag costs a concurrency round trip); their names name the sample
    assert tasks and all(not tr.tags and tr.name.startswith("s") for tr in tasks)
    assert {a.key for a in arts} >= {f"agentbatch-{tag}-batch-1-{k}" for k in ("progress", "summary", "report")}


def test_quiet_prints_only_the_outcome(demo):
    r = cli(["run", "examples/bfcl_demo.yaml", "--db", "sqlite:///runs/demo.sqlite", "--quiet"], cwd=demo.workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "agentbatch.progress" not in r.stderr and " INFO " not in r.stderr
    assert "batch 2 created" in r.stdout and "batch 2 (bfcl-demo): completed, 3/3 completed" in r.stdout
