"""50 BFCL multi-turn samples driven by a plain `openai`-SDK loop through the inference gateway, in front
of two real-time simulated workers: routing stays with the sample's worker, the in-flight limits hold
in the recorded intervals, every call is a step row, scores are right, and the report renders."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from gateway_helpers import (
    MODEL,
    BfclHarnessEnv,
    gateway_config,
    ground_truth_policy,
    serve_gateway,
    sim_workers,
)
from openai import AsyncOpenAI
from plain_openai_harness import run_sample
from testkit import max_overlap

from agentbatch.dashboards.report import write_report
from agentbatch.dashboards.summary import summarize
from agentbatch.db.models import StepStatus
from agentbatch.db.store import Store
from agentbatch.environments.bfcl import BfclWorkload

N_SAMPLES = 50
MAX_ACTIVE = 12
PER_WORKER = 3


def assert_every_call_recorded(samples: dict, by_sample: dict, calls: dict) -> None:
    """Every call the harness made is one step row, indices in order, with tokens and its worker."""
    for sample_id, rows in by_sample.items():
        task_id = samples[sample_id].task_id
        assert len(rows) == calls[task_id], task_id
        assert [r.index for r in sorted(rows, key=lambda r: r.started_at)] == list(range(len(rows)))
        assert samples[sample_id].steps_done == len(rows)
    steps = [r for rows in by_sample.values() for r in rows]
    assert all(r.worker in ("w0", "w1") and r.prompt_tokens and r.output_tokens for r in steps)
    assert sum(r.cached_prompt_tokens or 0 for r in steps) > 0.5 * sum(r.prompt_tokens for r in steps)


def assert_routed_back(by_sample: dict) -> None:
    """>= 90 % of each sample's later calls go back to its previous worker; both workers serve."""
    for rows in by_sample.values():
        rows.sort(key=lambda r: r.index)
        repeats = list(zip(rows, rows[1:], strict=False))
        same = sum(a.worker == b.worker for a, b in repeats)
        assert same >= 0.9 * len(repeats), [r.worker for r in rows]
    assert {rows[0].worker for rows in by_sample.values()} == {"w0", "w1"}


def assert_in_flight_limits(steps: list) -> None:
    """From the recorded intervals: never more than PER_WORKER requests at once on a worker, and the
    limit was reached (so it was tested)."""
    peaks = [max_overlap([(r.started_at, r.finished_at) for r in steps if r.worker == w]) for w in ("w0", "w1")]
    assert max(peaks) == PER_WORKER


async def drive(base_url: str, workload: BfclWorkload, task_ids: list[str], *, stream_every: int = 5):
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    calls: dict[str, int] = defaultdict(int)

    async def one(i: int, task_id: str) -> float:
        env = BfclHarnessEnv(task_id)

        async def count(message: dict) -> None:
            calls[task_id] += 1

        await run_sample(client, MODEL, task_id, env, ground_truth_policy(workload, task_id),
                         stream=i % stream_every == 0, on_step=count)
        return await env.score()

    try:
        scores = await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids)))
    finally:
        await client.close()
    return dict(zip(task_ids, scores, strict=True)), calls


def test_fifty_bfcl_samples_through_the_gateway(sqlite_url, tmp_path):
    workload = BfclWorkload(categories=["multi_turn_base"], limit=N_SAMPLES, seed=7)
    task_ids = [t.task_id for t in workload.tasks()]
    store = Store(sqlite_url)
    with sim_workers(2, time_scale=0.5) as endpoints:
        config = gateway_config(endpoints, max_active_samples=MAX_ACTIVE, per_worker_inflight=PER_WORKER)
        with serve_gateway(store, config, endpoints) as gw:
            scores, calls = asyncio.run(drive(gw.base_url + "/v1", workload, task_ids))
            batch_id = gw.batch_id

    # The answers went through unchanged: every sample scores with the official checker.
    assert scores == {t: 1.0 for t in task_ids}
    assert store.get_batch(batch_id).status == "completed"

    samples = {s.id: s for s in store.samples(batch_id)}
    assert sorted(s.task_id for s in samples.values()) == sorted(task_ids)  # identified by `user`
    steps = store.steps(batch_id)
    assert {s.kind for s in steps} == {"inference"} and {s.status for s in steps} == {StepStatus.COMPLETED}, [
        (s.sample_id, s.index, s.attempt, s.error) for s in steps if s.status != "completed"]
    by_sample: dict[int, list] = defaultdict(list)
    for s in steps:
        by_sample[s.sample_id].append(s)
    assert_every_call_recorded(samples, by_sample, calls)
    assert_routed_back(by_sample)
    assert_in_flight_limits(steps)

    # The report renders and the summary reads the batch like any other.
    index = write_report(store, [batch_id], tmp_path / "report")
    assert index.exists() and index.stat().st_size > 1000
    text = summarize(store, batch_id).to_text()
    assert f"{N_SAMPLES}/{N_SAMPLES} completed" in text
