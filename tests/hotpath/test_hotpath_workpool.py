"""Scale-out as Prefect work-pool workers: `agentbatch join BATCH --work-pool POOL --workers 2`
registers a deployment of the join flow and two flow runs of it; a real `prefect worker start` runs
them against one PostgreSQL store. Both flow runs complete, both claim samples, every sample
completes once, no (sample, step) completes twice, and the server keeps no password."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from testkit import run_cli_here

from agentbatch.dashboards.artifacts import store_tag
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.join import FLOW_NAME, worker_variables
from agentbatch.flows.store_url import DB_PASSWORD_VARIABLE, flow_param_url, url_from_param
from agentbatch.protocols.secrets import to_stored

CONFIG = {
    "name": "workpool",
    "workload": {"kind": "bfcl", "params": {"limit": 12, "seed": 7}},
    "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 1.0}}},
    "scheduling": {"max_active_samples": 2, "env_slots": 2, "per_worker_inflight": 2},
}
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", *argv], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)


async def make_pool(name: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=name, type="process"), overwrite=True)


async def deployment_runs(name: str) -> tuple[Any, list[Any]]:
    """The deployment `agentbatch-join/NAME` and its flow runs (None, [] when it does not exist)."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            d = await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        except ObjectNotFound:
            return None, []
        runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[d.id])))
    return d, runs


def start_worker(pool: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the worker's process group (it and any flow-run process it started; by now their
    runs are over, and a graceful stop of a Prefect worker takes many seconds)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def lease_pids(store: Store, batch_id: int) -> dict[str, set[int]]:
    """The samples each process (by the pid in its lease owner id `host:pid:random`) holds right now."""
    held: dict[str, set[int]] = {}
    for s in store.samples(batch_id):
        if s.lease_owner:
            held.setdefault(s.lease_owner.split(":")[1], set()).add(s.id)
    return held


def completed_steps(store: Store, batch_id: int) -> set[tuple[int, int]]:
    done: set[tuple[int, int]] = set()
    for st in store.steps(batch_id):
        if st.status == "completed":
            assert (st.sample_id, st.index) not in done, f"step {(st.sample_id, st.index)} completed twice"
            done.add((st.sample_id, st.index))
    return done


def check_batch_done_once(store: Store, batch_id: int) -> None:
    """Every sample completed, its chain complete and gap-free, no (sample, step) completed twice."""
    samples = store.samples(batch_id)
    assert all(s.status == "completed" and s.score == 1.0 and s.lease_owner is None for s in samples)
    done = completed_steps(store, batch_id)
    for s in samples:
        assert sorted(i for sid, i in done if sid == s.id) == list(range(s.steps_done)) and s.steps_done > 0
    assert store.get_batch(batch_id).status == "completed"


def check_no_password(params: dict[str, Any], password: str, batch_id: int) -> None:
    """Parameters as the Prefect server keeps them: the store URL with a reference, not the password."""
    assert f":{password}@" not in json.dumps(params)
    assert make_url(params["db_url"]).password == f"${{{DB_PASSWORD_VARIABLE}}}"
    assert params["batch_id"] == batch_id


def wait_for_runs(name: str, store: Store, batch_id: int, worker: subprocess.Popen[bytes],
                  log: Path) -> tuple[list[Any], dict[str, set[int]]]:
    """Poll until both flow runs are in a terminal state; the samples each process held meanwhile."""
    pids: dict[str, set[int]] = {}
    deadline = time.monotonic() + 240
    while True:
        for pid, held in lease_pids(store, batch_id).items():
            pids.setdefault(pid, set()).update(held)
        _, runs = asyncio.run(deployment_runs(name))
        if len(runs) == 2 and all(r.state and r.state.type.value in TERMINAL for r in runs):
            return runs, pids
        assert worker.poll() is None, f"the worker exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"flow runs not finished: {[(r.name, r.state_name) for r in runs]}\n" \
            f"{log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.usefixtures("prefect_api")
def test_join_as_work_pool_flow_runs(pg_url: str, tmp_path: Path) -> None:
    password = make_url(pg_url).password
    assert password, "the test needs a store URL with a password (AGENTBATCH_TEST_PG_URL)"
    store = Store(pg_url)
    batch_id = create_batch(BatchConfig.model_validate(CONFIG), store)
    pool = f"agentbatch-join-{uuid.uuid4().hex[:8]}"
    asyncio.run(make_pool(pool))

    joined = cli("join", str(batch_id), "--work-pool", pool, "--workers", "2", "--chunk", "2", "--poll", "0.5",
                 env={"AGENTBATCH_DB_URL": pg_url})
    assert joined.returncode == 0, joined.stderr
    assert f"prefect worker start --pool {pool}" in joined.stdout and DB_PASSWORD_VARIABLE in joined.stdout
    assert f":{password}@" not in joined.stdout + joined.stderr
    name = f"batch-{batch_id}-{store_tag(pg_url)}"  # batch ids repeat across stores: the store's tag too
    deployment, runs = asyncio.run(deployment_runs(name))
    assert deployment.work_pool_name == pool and deployment.entrypoint == "agentbatch.flows.join.join_flow"
    assert len(runs) == 2 and not any(s.status == "completed" for s in store.samples(batch_id))  # nothing ran yet

    # The worker machine: the password variable set, no AGENTBATCH_DB_URL; runs are picked up within a second.
    env = {k: v for k, v in os.environ.items() if k != "AGENTBATCH_DB_URL"}
    env.update({DB_PASSWORD_VARIABLE: password, "PREFECT_WORKER_QUERY_SECONDS": "1"})
    log = tmp_path / "worker.log"
    worker = start_worker(pool, env, log)
    try:
        runs, pids = wait_for_runs(name, store, batch_id, worker, log)
    finally:
        stop(worker)
    assert [r.state.type.value for r in runs] == ["COMPLETED", "COMPLETED"], log.read_text()[-3000:]
    assert len(pids) == 2, f"both flow runs should have claimed samples, lease owners seen: {pids}"
    assert str(worker.pid) not in pids  # the flow runs' own processes, not the worker

    check_batch_done_once(store, batch_id)
    for params in [deployment.parameters, *(r.parameters for r in runs)]:  # what the server keeps
        check_no_password(params, password, batch_id)
    store.close()


@pytest.mark.usefixtures("prefect_api")
def test_work_pool_bad_input_creates_nothing(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    batch_id = create_batch(BatchConfig.model_validate(CONFIG), store)
    store.close()
    pool = f"agentbatch-join-{uuid.uuid4().hex[:8]}"
    asyncio.run(make_pool(pool))
    db = ("--db", sqlite_url)
    missing = sqlite_url.replace("agentbatch.sqlite", "missing.sqlite")
    cases = [
        (("join", "1", "--db", missing, "--work-pool", pool), "no store at"),
        (("join", str(batch_id), *db, "--work-pool", "no-such-pool"), "no work pool 'no-such-pool'"),
        (("join", "999", *db, "--work-pool", pool), "no batch 999"),
        (("join", str(batch_id), *db, "--work-pool", pool, "--workers", "0"), "--workers: expected"),
        (("join", str(batch_id), *db, "--workers", "3"), "--workers: only with --work-pool"),
    ]
    for argv, expected in cases:
        out = run_cli_here(list(argv))
        assert out.returncode == 2 and expected in out.stderr, (argv, out.stderr)
    # Prefect's settings are read once per process: another API in a process of its own
    out = cli("join", str(batch_id), *db, "--work-pool", pool, env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert out.returncode == 2 and "does not answer" in out.stderr, out.stderr
    no_api = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "join", str(batch_id), *db, "--work-pool", pool],
                         env={**no_api, "AGENTBATCH_PREFECT_SERVER": "ephemeral"}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "no Prefect server" in out.stderr, out.stderr
    assert not Path(missing.removeprefix("sqlite:///")).exists()
    tag = store_tag(sqlite_url)
    assert asyncio.run(deployment_runs(f"batch-{batch_id}-{tag}")) == (None, [])  # nothing registered
    assert asyncio.run(deployment_runs(f"batch-999-{tag}")) == (None, [])


def test_worker_resolves_the_password_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg://alice:s3cret-pw@db.example:5432/evals"
    monkeypatch.delenv(DB_PASSWORD_VARIABLE, raising=False)
    stored = flow_param_url(url)  # as `join --work-pool` stores it (and sets the variable in its own process)
    assert "s3cret-pw" not in stored and make_url(stored).password == f"${{{DB_PASSWORD_VARIABLE}}}"
    assert url_from_param(stored) == url
    monkeypatch.delenv(DB_PASSWORD_VARIABLE)  # another machine: the variable is not set there
    monkeypatch.setenv("AGENTBATCH_DB_URL", url)
    assert url_from_param(stored) == url  # ...but its AGENTBATCH_DB_URL names the same database
    monkeypatch.setenv("AGENTBATCH_DB_URL", "postgresql+psycopg://alice:other@db.example:5432/another")
    with pytest.raises(ValueError, match=DB_PASSWORD_VARIABLE):
        url_from_param(stored)
    assert url_from_param("sqlite:////tmp/x.sqlite") == "sqlite:////tmp/x.sqlite"
    # What `join --work-pool` tells each worker machine to set: the store's password and the config's secrets.
    monkeypatch.delenv("AGENTBATCH_SECRET_ENGINE_PARAMS_API_KEY", raising=False)  # to_stored sets it: undone after
    config = to_stored({"engine": {"params": {"api_key": "sk-abcdef123456", "base_url": "http://h/v1"}}})
    assert worker_variables(config, stored) == [DB_PASSWORD_VARIABLE, "AGENTBATCH_SECRET_ENGINE_PARAMS_API_KEY"]
    assert worker_variables({"engine": {"kind": "scripted"}}, "sqlite:////tmp/x.sqlite") == []
