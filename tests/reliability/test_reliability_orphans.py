"""Finding 7: servers a run starts as children die with it when the run is killed with SIGKILL.

A run on Prefect's temporary server (no Prefect API configured) starts a uvicorn child; SIGKILL of
the run (its pid only, not its process group) used to leave that server running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config, write_config
from testkit import CLI


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        out += [int(c) for c in text.split()]
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


@pytest.mark.slow
def test_sigkill_of_a_run_leaves_no_prefect_server(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, bfcl_config("orphan", limit=40))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(AGENTBATCH_DB_URL=f"sqlite:///{tmp_path / 'o.sqlite'}", AGENTBATCH_PREFECT_SERVER="ephemeral",
               PREFECT_HOME=str(tmp_path / "prefect"), AGENTBATCH_HOME=str(tmp_path / "home"))
    run = subprocess.Popen([*CLI, "run", str(cfg), "--no-progress"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    server = None
    try:
        deadline = time.time() + 240
        while server is None and time.time() < deadline:
            assert run.poll() is None, "the run ended before its Prefect server was seen"
            server = next((c for c in children(run.pid) if "uvicorn" in cmdline(c)), None)
            time.sleep(0.2)
        assert server is not None, "no temporary Prefect server started"
        os.kill(run.pid, signal.SIGKILL)  # the run only: its children are not signalled by us
        run.wait()
        deadline = time.time() + 60
        while alive(server) and time.time() < deadline:
            time.sleep(0.2)
        assert not alive(server), f"orphaned Prefect server {server}: {cmdline(server)}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        if server is not None and alive(server):
            os.kill(server, signal.SIGKILL)
