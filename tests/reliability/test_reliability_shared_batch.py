"""Finding 3: many processes on one batch. `run` holds a window of samples and claims more as it goes,
so `join` processes started beside it share the work; `create` writes a batch and starts nothing.

Real processes on real PostgreSQL (SQLite for `create`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config, duplicates, start_cli, write_config
from testkit import run_cli_here

from agentbatch.db.store import Store


def owner_pid(owner: str) -> int:
    return int(owner.split(":")[1])


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_run_and_two_joins_each_drive_samples(pg_url: str, tmp_path: Path) -> None:
    # 40 samples, admission limit 4: `run` holds 16 at a time (once: all 40 from its start)
    path = write_config(tmp_path, bfcl_config("shared", limit=40, scale=2.0))
    logs = [tmp_path / f"p{i}.log" for i in range(3)]
    run = start_cli(["run", str(path), "--no-progress"], pg_url, stdout=logs[0].open("w"), stderr=subprocess.STDOUT)
    store = Store(pg_url)
    drove: set[int] = set()  # pids seen holding a sample's lease

    def look() -> None:
        drove.update(owner_pid(s.lease_owner) for s in store.samples(batch_id) if s.lease_owner)

    deadline = time.time() + 300
    while not (batches := store.list_batches()) or not any(s.lease_owner for s in store.samples(batches[0].id)):
        assert run.poll() is None and time.time() < deadline, logs[0].read_text()
        time.sleep(0.2)
    batch_id = batches[0].id
    joins = [start_cli(["join", str(batch_id), "--chunk", "2", "--poll", "0.5", "--no-progress"], pg_url,
                       stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs[1:]]
    procs = [run, *joins]
    while any(p.poll() is None for p in procs):
        assert time.time() < deadline + 600, "the batch did not finish"
        look()
        time.sleep(0.2)
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log.read_text()
    assert {p.pid for p in procs} <= drove, (drove, [p.pid for p in procs])
    assert all(s.status == "completed" for s in store.samples(batch_id))
    assert duplicates(store, batch_id) == {}
    assert store.get_batch(batch_id).status == "completed"
    store.close()


def test_create_writes_the_batch_and_starts_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'created.sqlite'}"
    path = write_config(tmp_path, bfcl_config("created", limit=3))
    done = run_cli_here(["create", str(path)], url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "batch 1 created (3 samples)" in done.stdout and "agentbatch join 1" in done.stdout
    store = Store(url)
    assert store.get_batch(1).status == "pending"
    assert [(s.status, s.lease_owner, s.steps_done) for s in store.samples(1)] == [("pending", None, 0)] * 3
    assert store.steps(1) == []
    store.close()
    bad = run_cli_here(["create", str(tmp_path / "missing.yaml")], f"sqlite:///{tmp_path / 'none.sqlite'}")
    assert bad.returncode == 2 and not (tmp_path / "none.sqlite").exists()
