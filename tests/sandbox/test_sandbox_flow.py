"""A container batch end to end through the Prefect batch flow: bash_tasks with the scripted engine,
every sample scored 1.0 from its test run in its own sandbox, even with containers killed from
outside mid-batch (detected, replaced, rebuilt, the step retried); no container is left behind; a
batch whose containers cannot start should fail its samples, not the batch."""

from __future__ import annotations

import threading
import time

import pytest

from agentbatch.db.store import Store
from agentbatch.environments.docker_pool import list_labelled
from agentbatch.flows.batch import run_batch
from agentbatch.flows.config import BatchConfig

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def killer(docker_client, label: str, stop: threading.Event, killed: list[str], most: int = 3) -> None:
    """Kill, from outside, running containers of the batch that have already run a command; at most
    one per sample (a second kill of the same sample would use up its one retry)."""
    while not stop.is_set() and len(killed) < most:
        for info in list_labelled(docker_client, label):
            sample = info["Labels"].get("agentbatch.sample")
            if sample in killed or info["State"] != "running":
                continue
            try:
                if docker_client.api.inspect_container(info["Id"]).get("ExecIDs"):
                    docker_client.api.kill(info["Id"])
                    killed.append(sample)
                    break
            except Exception:  # noqa: BLE001 - it went away on its own meanwhile
                continue
        time.sleep(0.3)


FEW = ["last-n", "is-even", "fizzbuzz", "mean-empty", "merge-dicts", "slugify-missing", "binary-search", "clamp-args"]


def config(label: str, **params) -> BatchConfig:
    params.setdefault("tasks", FEW)
    return BatchConfig.model_validate({
        "name": "sandbox-e2e",
        "workload": {"kind": "bash_tasks", "params": {"batch_label": label, "max_containers": 4, **params}},
        "engine": {"kind": "scripted", "params": {"workers": 2}},
        "scheduling": {"max_active_samples": 6, "env_slots": 3, "per_worker_inflight": 4},
        "retries": {"environment": 1, "backoff_s": 0.1},
    })


def test_unstartable_sandboxes_fail_samples_not_the_batch(docker_client, batch_label: str, sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        batch_id = run_batch(
            config(batch_label, tasks=["last-n", "is-even"], image="agentbatch-no-such-image:0"), store,
            show_progress=False,
        )
        batch = store.get_batch(batch_id)
        samples = store.samples(batch_id)
    finally:
        store.close()
    # The flow ran to its end (no crash, batch.error empty); every sample failed, so the batch is "failed".
    assert batch.status == "failed" and batch.error is None
    assert [s.status for s in samples] == ["failed", "failed"] or all(s.status == "failed" for s in samples)
    assert all("sandbox" in (s.error or "") for s in samples), [s.error for s in samples]
    assert list_labelled(docker_client, batch_label) == []


def test_container_batch_through_the_flow_with_kills(docker_client, batch_label: str, sqlite_url: str) -> None:
    """Scores every sample correctly, although up to 3 of its containers are killed from outside."""
    stop, killed = threading.Event(), []
    thread = threading.Thread(target=killer, args=(docker_client, batch_label, stop, killed))
    store = Store(sqlite_url)
    thread.start()
    try:
        batch_id = run_batch(config(batch_label), store, show_progress=False)
        samples = store.samples(batch_id)
        steps = store.steps(batch_id)
    finally:
        stop.set()
        thread.join()
        store.close()
    assert len(samples) == len(FEW)
    env_steps = [st for st in steps if st.kind == "environment" and st.status == "completed"]
    assert sum(st.tool_calls or 0 for st in env_steps) >= len(samples)
    assert killed, "the batch ended before any container could be killed"
    # every sample still solved its task: the dead sandbox was replaced and rebuilt, the step retried
    wrong = [(s.task_id, s.status, s.score, s.error, s.result) for s in samples if s.status != "completed" or s.score != 1.0]
    assert not wrong, (wrong, killed)
    failed_attempts = [st for st in steps if st.status == "failed"]
    replaced = sum((s.result or {}).get("replacements", 0) for s in samples)
    assert failed_attempts or replaced  # detected: a failed attempt recorded, or rebuilt while scoring
    assert all("gone" in (st.error or "") or "sandbox" in (st.error or "") for st in failed_attempts)
    assert list_labelled(docker_client, batch_label) == []
