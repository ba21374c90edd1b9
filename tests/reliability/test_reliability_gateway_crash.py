"""A gateway that dies with tool calls in flight: nothing claims them done, and `status` says so.

The tool gateway (`/mcp`) records each call of a sample as an environment step; a call that runs
longer than a moment gets a `running` row. A gateway killed then leaves that row `running` (its batch
is never resumed: a restarted gateway serves a new batch), so `status` of the dead batch counts it as
cut short by the crash, not done and not running, and says that its call may have taken effect. A
live gateway beats its batch's heartbeat, so it does not read `crashed` after a minute.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from agentbatch.dashboards.eta import STALE_AFTER_S, estimate_eta
from agentbatch.db.models import Batch, Step
from agentbatch.db.store import Store
from agentbatch.flows.commands import gateway as gateway_command
from agentbatch.flows.progress import HEARTBEAT_S


def test_a_dead_gateways_tool_call_reads_cut_short_not_done(store: Store) -> None:
    batch_id = store.create_batch("gw", {"engine": {"kind": "gateway"}}, [("t1", {})])
    sample = store.samples(batch_id)[0]
    store.mark_batch_running(batch_id)
    with store.session() as s, s.begin():  # what the gateway's writer left when the process died
        s.add(Step(batch_id=batch_id, sample_id=sample.id, index=1, kind="environment", attempt=1,
                   status="running", enqueued_at=0.0, started_at=0.0, worker="env-0",
                   request={"calls": [{"name": "refund", "server": "shop", "arguments": {"r": "r1"}}]}))
        s.get_one(Batch, batch_id).heartbeat_at = time.time() - STALE_AFTER_S - 5
    eta = estimate_eta(store, batch_id)
    assert eta.status == "crashed" and eta.steps_running == 0 and eta.steps_cut_short == 1
    text = eta.to_text()
    assert "1 cut short by the crash" in text and "may have taken effect" in text, text
    assert [(st.status, st.error) for st in store.steps(batch_id)] == [("running", None)]  # read-only: nothing claimed


def test_the_gateway_beats_its_batchs_heartbeat(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentbatch.flows.progress.HEARTBEAT_S", 0.0)
    assert HEARTBEAT_S > 0
    batch_id = store.create_batch("gw", {}, [])
    store.mark_batch_running(batch_id)
    with store.session() as s, s.begin():
        s.get_one(Batch, batch_id).heartbeat_at = 1.0
    fake = SimpleNamespace(opened=True, batch_id=batch_id, store=store, tools=SimpleNamespace(tools=[]),
                           batch=SimpleNamespace(config={}),
                           state=SimpleNamespace(registry=SimpleNamespace(samples={}, active=0)))

    def beat_at() -> float:
        batch = store.get_batch(batch_id)
        return batch.heartbeat_at if batch is not None and batch.heartbeat_at is not None else 0.0

    async def watch_a_moment() -> None:
        task = asyncio.create_task(gateway_command._watch(fake, {"host": "127.0.0.1", "port": 1, "expect": 0,
                                                                 "progress": False}))
        for _ in range(100):  # the first beat comes after its first second
            await asyncio.sleep(0.2)
            if beat_at() > 1.0:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(watch_a_moment())
    assert beat_at() > time.time() - 60
    assert estimate_eta(store, batch_id).status == "running"
