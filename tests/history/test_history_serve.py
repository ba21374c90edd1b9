"""A deployment with a 20 s interval fires at least twice under `agentbatch serve` against a real
Prefect server: two batches linked to their flow runs and the deployment, the second admitted with
the first's priors; `history` lists both and `diff` finds no regression (the scripted engine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from history_helpers import cli, config, write_config

from agentbatch.db import history
from agentbatch.db.store import Store
from agentbatch.flows.deployments import FLOW_NAME

INTERVAL_S = 20
WAIT_S = 110  # the first run fires one interval after deploy, the second one later


async def deployment_and_runs(name: str, flow_run_ids: list[str]) -> tuple[str, list[str | None]]:
    from prefect import get_client

    async with get_client() as client:
        deployment = await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        runs = [await client.read_flow_run(r) for r in flow_run_ids]
    return str(deployment.id), [str(r.deployment_id) if r.deployment_id else None for r in runs]


async def latest_artifact(key: str) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        found = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return str(found[0].data)


def completed_batches(db: str) -> list[int]:
    """Batches whose scheduled flow run has finished (batch completed, diff artifact published)."""
    store = Store(db)
    try:
        done = [(b.id, b.flow_run_id) for b in store.list_batches() if b.status.startswith("completed")]
    finally:
        store.close()
    return [b for b, run in done if run and asyncio.run(flow_run_state(run)) == "COMPLETED"]


async def flow_run_state(flow_run_id: str) -> str | None:
    from prefect import get_client

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
    return run.state.type.value if run.state else None


def stop(proc: subprocess.Popen) -> bytes:
    """SIGTERM to the serve process group (it and the flow runs it started), SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_serve_fires_a_deployment_twice(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path / 'nightly.sqlite'}"
    path = write_config(tmp_path / "nightly.yaml", config())
    assert cli("deploy", str(path), "--name", "nightly-test", "--interval", str(INTERVAL_S), "--db", db,
               "--param", "tag=ckpt-a", "--param", "scheduling.env_slots=2") == 0
    assert "registered: every 20 s" in capsys.readouterr().out

    serve = subprocess.Popen([sys.executable, "-m", "agentbatch.flows.cli", "serve", "nightly-test", "--poll", "2"],
                             env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while len(completed_batches(db)) < 2 and time.monotonic() < deadline and serve.poll() is None:
            time.sleep(2)
    finally:
        out = stop(serve)
    done = completed_batches(db)
    assert len(done) >= 2, out.decode(errors="replace")[-3000:]

    store = Store(db)
    b1, b2 = done[:2]
    rows = [history.suite_row(store, b) for b in (b1, b2)]
    assert {r.deployment for r in rows} == {f"{FLOW_NAME}/nightly-test"} and {r.tag for r in rows} == {"ckpt-a"}
    assert store.get_batch(b1).config["scheduling"]["env_slots"] == 2  # the override reached the run
    flow_runs = [store.get_batch(b).flow_run_id for b in (b1, b2)]
    assert len(set(flow_runs)) == 2 and None not in flow_runs
    deployment_id, run_deployments = asyncio.run(deployment_and_runs("nightly-test", flow_runs))
    assert run_deployments == [deployment_id, deployment_id] and rows[0].deployment_id == deployment_id
    p = history.priors_used(store, b2)
    assert (p.source, p.runs, p.tasks) == ("suite", 1, 4)  # the second run used the first's chain lengths
    store.close()

    assert cli("history", "nightly-test", "--db", db, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["batch_id"] for r in listed[rows[0].suite_key]][:2] == [b1, b2]
    assert cli("diff", str(b1), str(b2), "--db", db) == 0
    assert "regressions: 0 task(s)" in capsys.readouterr().out
    # The run's own artifact (one key per deployment) says the same; serve paused the schedule on exit.
    markdown = asyncio.run(latest_artifact("agentbatch-diff-nightly-test"))
    assert f"batch {b2} vs previous run {b1}" in markdown and "no regressed task" in markdown
    assert asyncio.run(read_deployment("nightly-test")).paused


async def make_pool(name: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=name, type="process"), overwrite=True)


async def read_deployment(name: str) -> object:
    from prefect import get_client

    async with get_client() as client:
        return await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")


@pytest.mark.usefixtures("prefect_api")
def test_work_pool_form_and_bad_schedules(tmp_path, capsys) -> None:
    path = write_config(tmp_path / "nightly.yaml", config())
    db = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    assert cli("deploy", str(path), "--name", "bad-cron", "--cron", "61 * * *", "--db", db) == 2
    assert "cannot register" in capsys.readouterr().err
    asyncio.run(make_pool("agentbatch-test-pool"))
    assert cli("deploy", str(path), "--name", "pooled", "--cron", "0 2 * * *", "--db", db,
               "--work-pool", "agentbatch-test-pool") == 0
    assert "prefect worker start --pool agentbatch-test-pool" in capsys.readouterr().out
    d = asyncio.run(read_deployment("pooled"))
    assert d.work_pool_name == "agentbatch-test-pool" and not d.paused  # workers poll it
    assert d.entrypoint == "agentbatch.flows.deployments.scheduled_eval"  # importable on any machine
    assert d.parameters["db_url"] == db and d.parameters["config"]["name"] == "nightly"
    assert cli("serve", "pooled") == 2  # served by the pool's workers, not by `serve`
    assert "pooled" in capsys.readouterr().err
    assert cli("deploy", str(path), "--name", "anchored", "--interval", "86400", "--anchor", "2026-12-04T02:00:00",
               "--db", db) == 0
    schedule = asyncio.run(read_deployment("anchored")).schedules[0].schedule
    assert schedule.interval.total_seconds() == 86400
    assert schedule.anchor_date.isoformat().startswith("2026-12-04T02:00:00")  # UTC: no offset given


async def resume(name: str) -> None:
    from prefect import get_client

    async with get_client() as client:
        await client.resume_deployment((await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")).id)


@pytest.mark.usefixtures("prefect_api")
def test_redeploy_keeps_a_served_schedule_active(tmp_path, capsys) -> None:
    path = write_config(tmp_path / "nightly.yaml", config())
    args = ("deploy", str(path), "--name", "redeployed", "--cron", "0 3 * * *", "--db", f"sqlite:///{tmp_path}/r.sqlite")
    assert cli(*args) == 0
    assert asyncio.run(read_deployment("redeployed")).paused  # nobody serves it yet
    asyncio.run(resume("redeployed"))  # as `serve` does while it runs
    assert cli(*args, "--param", "tag=ckpt-b") == 0
    d = asyncio.run(read_deployment("redeployed"))
    assert not d.paused and d.parameters["tag"] == "ckpt-b"


async def deployment_runs(name: str) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    async with get_client() as client:
        d = await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[d.id])))


async def delete_runs(runs: list) -> None:
    from prefect import get_client

    async with get_client() as client:
        for r in runs:
            await client.delete_flow_run(r.id)


@pytest.mark.usefixtures("prefect_api")
def test_an_event_starts_a_tagged_run(tmp_path) -> None:
    from prefect.events import emit_event

    path = write_config(tmp_path / "nightly.yaml", config())
    assert cli("deploy", str(path), "--name", "on-checkpoint", "--cron", "0 4 * * *", "--db",
               f"sqlite:///{tmp_path}/e.sqlite", "--on-event", "agentbatch.test.checkpoint") == 0
    time.sleep(2)  # the automation reaches the server's trigger service
    emit_event(event="agentbatch.test.checkpoint",
               resource={"prefect.resource.id": "checkpoint.77", "prefect.resource.name": "ckpt-77"})
    deadline = time.monotonic() + 60
    while not (runs := asyncio.run(deployment_runs("on-checkpoint"))) and time.monotonic() < deadline:
        time.sleep(2)
    asyncio.run(delete_runs(runs))  # nobody serves it here
    assert [r.parameters["tag"] for r in runs] == ["ckpt-77"]


@pytest.mark.usefixtures("prefect_api")
def test_a_deployment_runs_in_the_folder_it_was_deployed_from(tmp_path, monkeypatch, capsys) -> None:
    """A flow run of the deployment, executed as a Prefect process worker executes one, from another
    folder: it works in the deploy folder (a relative store path lands there, not in a temporary copy
    of the worker's folder that Prefect deletes after the run) and copies nothing."""
    deployed_from = tmp_path / "evals"
    deployed_from.mkdir()
    monkeypatch.chdir(deployed_from)
    path = write_config(deployed_from / "nightly.yaml", config())
    assert cli("deploy", str(path), "--name", "here-test", "--interval", "86400", "--db", "sqlite:///here.sqlite") == 0
    capsys.readouterr()
    worker_folder = tmp_path / "worker"
    worker_folder.mkdir()
    (worker_folder / "big.bin").write_bytes(b"x" * 1024)  # would be copied into each run's workspace

    async def create_run() -> str:
        from prefect import get_client

        async with get_client() as client:
            deployment = await client.read_deployment_by_name(f"{FLOW_NAME}/here-test")
            return str((await client.create_flow_run_from_deployment(deployment.id)).id)

    run_id = asyncio.run(create_run())
    done = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "execute", run_id], cwd=worker_folder,
                          env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Downloading flow code" not in done.stdout + done.stderr
    store = Store(f"sqlite:///{deployed_from / 'here.sqlite'}")
    assert [b.status for b in store.list_batches()] == ["completed"]
    store.close()
    assert asyncio.run(flow_run_state(run_id)) == "COMPLETED"
