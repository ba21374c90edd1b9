"""A sample ends without the harness's cooperation: an idle sample yields its admission slot to a
waiting sample and takes one again, first in line, when it comes back."""

from __future__ import annotations

import asyncio

import httpx
from gateway_helpers import MODEL, gateway_config, serve_gateway, sim_workers

from agentbatch.db.store import Store
from agentbatch.scheduling.core import ADMISSION, SchedulingCore
from agentbatch.scheduling.policies import AdmissionLimits, FcfsPriority, FifoQueue, RoundRobinRouter
from agentbatch.scheduling.types import SampleProgress

IDLE_TIMEOUT_S = 120.0


def _call(name: str, n: int) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}]}


async def _react_sample(http: httpx.AsyncClient, task: int) -> int:
    """A react-style loop that ends with a `submit` tool call and never says it is done."""
    messages = [{"role": "user", "content": f"solve task {task}"}]
    for n, name in enumerate(("search", "submit")):
        r = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "user": f"task-{task}", "agentbatch_response": _call(name, n)})
        r.raise_for_status()
        messages += [r.json()["choices"][0]["message"], {"role": "tool", "tool_call_id": f"call_{n}", "content": "ok"}]
        await asyncio.sleep(0.05)  # the harness runs the tool itself
    return len(messages)


def test_samples_ending_on_a_tool_call_do_not_hold_admission_until_the_idle_timeout(sqlite_url):
    """6 samples, 2 admission slots, every sample's last turn a tool call, no /finish: the waiting
    samples get their slots from the idle ones (4 yields), none waits for the 120 s idle timeout."""
    from agentbatch.gateway.state import GatewaySettings

    store = Store(sqlite_url)
    settings = GatewaySettings(idle_timeout_s=IDLE_TIMEOUT_S, yield_min_s=0.3, metrics_interval_s=0)
    with sim_workers(1) as endpoints:
        config = gateway_config(endpoints, max_active_samples=2)
        with serve_gateway(store, config, endpoints, settings=settings) as gw:

            async def main() -> list[int]:
                async with httpx.AsyncClient(base_url=gw.base_url, timeout=IDLE_TIMEOUT_S / 2) as http:
                    return await asyncio.gather(*(_react_sample(http, t) for t in range(6)))

            assert asyncio.run(main()) == [5] * 6
            status = httpx.get(gw.base_url + "/v1/batch").json()
            batch_id = gw.batch_id
    assert status["yielded"] >= 4 and status["ended"] == 0  # nobody ended: they yielded
    assert status["peaks"]["admission"] == 2
    samples = store.samples(batch_id)
    assert len(samples) == 6 and all(s.steps_done == 2 and s.result["ended"] == "shutdown" for s in samples)
    for step in store.steps(batch_id):
        assert step.started_at - step.enqueued_at < IDLE_TIMEOUT_S / 4


def test_a_sample_that_yielded_comes_back_first_in_line():
    core = SchedulingCore(AdmissionLimits(max_active_samples=1, env_slots=1, per_worker_inflight=4), ["w0"],
                          FifoQueue(), {"w0": FifoQueue()}, RoundRobinRouter(), FcfsPriority())
    a, b, c = (SampleProgress(sample_id=i, task_id=t, arrival_seq=i) for i, t in enumerate("abc"))
    admitted = []

    def grant(grants: list) -> None:
        admitted.extend(g.ticket.sample.task_id for g in grants if g.resource == ADMISSION)

    grant(core.submit(core.admission_ticket(a, 0.0), 0.0))
    grant(core.submit(core.admission_ticket(b, 0.1), 0.1))
    grant(core.submit(core.admission_ticket(c, 0.2), 0.2))
    grant(core.yield_admission(a, 1.0))  # a is idle: b takes its slot
    grant(core.submit(core.admission_ticket(a, 1.5), 1.5, first=True))  # a is back, ahead of c
    grant(core.finish(b, 2.0))
    assert admitted == ["a", "b", "a"] and len(core.admission.queue) == 1
    grant(core.finish(a, 3.0))
    assert admitted == ["a", "b", "a", "c"]
