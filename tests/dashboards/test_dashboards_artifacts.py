"""Prefect artifacts created inside a real Prefect flow run (the tests' Prefect server, the
prefect_api fixture), read back through the Prefect client."""

from __future__ import annotations

import asyncio

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.runtime import flow_run

from agentbatch.dashboards.artifacts import (
    BatchProgressArtifact,
    progress_key,
    publish_batch_artifacts,
    report_key,
    summary_key,
)
from agentbatch.db.store import Store


@pytest.fixture
def batch(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'agentbatch.sqlite'}")
    bid = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    yield store, bid
    store.close()


async def _read(key: str, run_id: str):
    """Artifacts of one key written by one flow run (the server lives for the whole test run)."""
    async with get_client() as client:
        return await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))


async def _read_all():
    async with get_client() as client:
        return await client.read_artifacts()


def test_progress_and_summary_artifacts_in_a_flow_run(prefect_api, batch, tmp_path):
    store, bid = batch
    report = tmp_path / "reports" / "index.html"

    @flow
    async def batch_flow() -> tuple[int, str]:
        progress = BatchProgressArtifact(min_interval_s=3600)  # throttle holds back all but the last
        await progress.start(bid, total=10, store_url=store.url)
        for done in range(1, 11):
            await progress.update(done)
        await publish_batch_artifacts(store, bid, report)
        return progress.sent, flow_run.id

    sent, run_id = asyncio.run(batch_flow())
    assert sent == 1  # 9 throttled, the last one always goes through

    (art,) = asyncio.run(_read(progress_key(bid, store.url), run_id))
    assert art.type == "progress"
    assert float(art.data) == pytest.approx(100.0)
    assert "10/10" in art.description
    assert art.flow_run_id is not None

    (table,) = asyncio.run(_read(summary_key(bid, store.url), run_id))
    assert table.type == "table"
    assert '"makespan_s"' in str(table.data) and "14.0" in str(table.data)

    (md,) = asyncio.run(_read(report_key(bid, store.url), run_id))
    assert md.type == "markdown"
    assert "| makespan | 14.00 s |" in md.data
    assert report.resolve().as_uri() in md.data


def test_throttle_sends_again_after_the_interval(prefect_api, batch):
    store, bid = batch

    @flow
    async def f() -> tuple[int, str]:
        progress = BatchProgressArtifact(min_interval_s=0.0)
        await progress.start(bid, total=4, store_url=store.url)
        await progress.update(1)
        await progress.update(2)
        return progress.sent, flow_run.id

    sent, run_id = asyncio.run(f())
    assert sent == 2
    (art,) = asyncio.run(_read(progress_key(bid, store.url), run_id))
    assert float(art.data) == pytest.approx(50.0)


def test_samples_ending_at_once_send_one_update_at_a_time_and_the_last(prefect_api, batch):
    """400 samples ending at once (no throttle interval): each update waits for none, at most one request
    is on its way at any time, and the final value reaches the server."""
    store, bid = batch

    @flow
    async def f() -> tuple[int, str]:
        progress = BatchProgressArtifact(min_interval_s=0.0)
        await progress.start(bid, total=400, store_url=store.url)
        await asyncio.gather(*(progress.update(done) for done in range(1, 401)))
        return progress.sent, flow_run.id

    sent, run_id = asyncio.run(f())
    assert 2 <= sent < 20, sent  # the first, then the newest value after each, and the last
    (art,) = asyncio.run(_read(progress_key(bid, store.url), run_id))
    assert float(art.data) == pytest.approx(100.0) and "400/400" in art.description


def test_outside_a_flow_run_does_nothing(prefect_api, batch):
    store, bid = batch

    async def outside() -> BatchProgressArtifact:
        progress = BatchProgressArtifact()
        await progress.start(bid, total=3)
        await progress.update(3)
        await publish_batch_artifacts(store, bid, None)
        return progress

    progress = asyncio.run(outside())
    assert progress.artifact_id is None and progress.sent == 0
    # Every artifact on the server belongs to a flow run: none was created by the calls above.
    assert all(a.flow_run_id is not None for a in asyncio.run(_read_all()))
