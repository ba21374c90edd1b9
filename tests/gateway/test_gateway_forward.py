"""The gateway's worker client: an endpoint whose URL holds credentials and that has an api_key too
(aiohttp refuses an Authorization header beside URL credentials) still reaches the worker."""

from __future__ import annotations

import asyncio

from agentbatch.engines.sim_server import running_sim_server
from agentbatch.gateway.forward import WorkerEndpoint, WorkerPool


def test_url_credentials_beside_an_api_key_reach_the_worker() -> None:
    with running_sim_server("tiny-cpu", worker_name="sim-auth") as base:
        url = base.replace("http://", "http://agent:pw-FORWARD@")
        pool = WorkerPool([WorkerEndpoint(name="w", base_url=url, model="tiny-cpu", api_key="sk-FORWARD")])
        assert "pw-FORWARD" not in pool.urls["w"]

        async def ask() -> int:
            response = await pool.post("w", {"model": "tiny-cpu", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]})
            async with response:
                status = response.status
            await pool.aclose()
            return status

        assert asyncio.run(ask()) == 200
