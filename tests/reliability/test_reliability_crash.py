"""Honest status after `kill -9`: the batch reads `crashed` at once (its leases name a process of this
host that no longer exists; no waiting for the heartbeat to go stale), and its Prefect flow run is
set to Crashed by the run's watcher without anyone running a command."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config, completions, start_cli, write_config
from sqlalchemy import select
from testkit import run_cli_here, wait_until

from agentbatch.dashboards.eta import STALE_AFTER_S
from agentbatch.db.models import Sample
from agentbatch.db.store import Store


def flow_run_state(flow_run_id: str) -> str | None:
    from prefect.client.orchestration import get_client

    async def read() -> str | None:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            return run.state.type.value if run.state else None

    return asyncio.run(read())


def leased(store: Store, batch_id: int) -> bool:
    with store.session() as s:
        return s.scalar(select(Sample.id).where(Sample.batch_id == batch_id, Sample.lease_owner.is_not(None))
                        .limit(1)) is not None


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_9_reads_crashed_at_once_and_the_flow_run_is_crashed(db_url: str, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, bfcl_config("killed", limit=8))
    log = tmp_path / "run.log"
    proc = start_cli(["run", str(cfg), "--no-progress"], db_url, start_new_session=True, stdout=log.open("w"),
                     stderr=subprocess.STDOUT)
    store = Store(db_url)
    alive = lambda: proc.poll() is None  # noqa: E731
    batch = wait_until(lambda: next(iter(store.list_batches()), None), 300, "the batch is created", alive=alive)
    wait_until(lambda: store.get_batch(batch.id).flow_run_id and leased(store, batch.id)
               and len(completions(store, batch.id)) >= 2, 300, "the run drives samples", alive=alive)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.time()
    row = store.get_batch(batch.id)
    assert row.status == "running" and killed_at - (row.heartbeat_at or 0) < STALE_AFTER_S  # the beat is fresh

    # Nobody runs a command: the watcher the run started marks its flow run Crashed.
    state = wait_until(lambda: flow_run_state(row.flow_run_id) == "CRASHED", 120,
                       f"the flow run is Crashed (run log: {log.read_text()[-2000:]})")
    assert state

    status = run_cli_here(["status", str(batch.id)], db_url)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "crashed" in status.stdout and "no longer exists on this host" in status.stdout, status.stdout
    assert f"agentbatch resume {batch.id}" in status.stdout
    store.close()


def test_status_reads_crashed_when_the_lease_holder_here_is_gone(db_url: str) -> None:
    """The same rule without a run: a fresh heartbeat, a lease held by a pid of this host that has
    exited. Another host's lease, or a live pid's, keeps the batch `running`."""
    import socket
    import sys

    from sqlalchemy import update

    from agentbatch.dashboards.eta import estimate_eta

    store = Store(db_url)
    batch_id = store.create_batch("b", {}, [("t0", {}), ("t1", {})])
    store.mark_batch_running(batch_id, None)
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()

    def lease(owner: str) -> None:
        with store.session() as s, s.begin():
            s.execute(update(Sample).where(Sample.batch_id == batch_id)
                      .values(lease_owner=owner, lease_expires_at=time.time() + 30))

    lease(f"{socket.gethostname()}:{os.getpid()}:live")
    assert estimate_eta(store, batch_id).status == "running"
    lease(f"elsewhere:{dead_pid.pid}:remote")
    assert estimate_eta(store, batch_id).status == "running"  # another host: only its heartbeat can tell
    lease(f"{socket.gethostname()}:{dead_pid.pid}:dead")
    eta = estimate_eta(store, batch_id)
    assert eta.status == "crashed" and "no longer exists on this host" in eta.notes[-1]
    store.close()
