"""Test wiring around the plain harness: BFCL as the harness's own environment, ground-truth answers
as the "model", simulated workers, and a gateway built from a batch config."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from plain_openai_harness import EnvStep, Message, Policy

from agentbatch.db.store import Store
from agentbatch.engines.scripted import ScriptedEngine, ground_truth_lookup
from agentbatch.engines.sim_server import running_sim_server
from agentbatch.engines.timing import make_timing
from agentbatch.environments.bfcl import BfclEnvironment, BfclWorkload
from agentbatch.environments.mcp_client import McpServerSpec
from agentbatch.flows.batch import build_coordinator
from agentbatch.flows.config import BatchConfig
from agentbatch.gateway.forward import WorkerEndpoint
from agentbatch.gateway.server import Gateway, GatewayBatch, RunningGateway, running_gateway
from agentbatch.gateway.state import GatewaySettings
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import TaskSpec

MODEL = "tiny-cpu"


class BfclHarnessEnv:
    """A BFCL multi-turn task as the harness's local environment (tools executed in-process)."""

    def __init__(self, task_id: str) -> None:
        self.env = BfclEnvironment(TaskSpec(task_id=task_id))

    async def reset(self) -> tuple[list[Message], list[dict[str, Any]]]:
        reset = await self.env.reset(self.env.task)
        return list(reset.messages), list(reset.tools)

    async def step(self, message: Message) -> EnvStep:
        result = await self.env.step(message)
        return EnvStep(result.messages, result.done, result.info.get("tools"))

    async def score(self) -> float:
        return float((await self.env.score())["score"])


def ground_truth_policy(workload: BfclWorkload, task_id: str) -> Policy:
    """The next ground-truth assistant message, sent for the simulated server to answer with."""
    engine = ScriptedEngine("ground-truth", ground_truth_lookup(workload), make_timing(None))

    def policy(messages: list[Message]) -> dict[str, Any]:
        request = ChatRequest(messages=messages, tools=[], task_id=task_id, step_index=len(messages))
        return {"agentbatch_response": engine.next_message(request)}

    return policy


@contextlib.contextmanager
def sim_workers(n: int = 2, **kwargs: Any) -> Iterator[list[WorkerEndpoint]]:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_sim_server("tiny-cpu", worker_name=f"sim-{i}", **kwargs))
                for i in range(n)]
        yield [WorkerEndpoint(f"w{i}", url, MODEL) for i, url in enumerate(urls)]


def gateway_config(endpoints: list[WorkerEndpoint], **scheduling: Any) -> BatchConfig:
    return BatchConfig.model_validate({
        "name": "gateway-test",
        "engine": {"kind": "openai", "params": {"endpoints": [
            {"name": e.name, "base_url": e.base_url, "model": e.model} for e in endpoints]}},
        "scheduling": scheduling,
    })


@contextlib.contextmanager
def serve_gateway(store: Store, config: BatchConfig, endpoints: list[WorkerEndpoint], *,
                  upstreams: list[McpServerSpec] | None = None,
                  settings: GatewaySettings | None = None, graceful_s: float = 30.0) -> Iterator[RunningGateway]:
    coordinator = build_coordinator(config, [e.name for e in endpoints])
    gateway = Gateway(store, coordinator, endpoints, upstreams=upstreams or [],
                      batch=GatewayBatch(config.name, config.model_dump(mode="json")),
                      settings=settings or GatewaySettings(metrics_interval_s=0.5))
    with running_gateway(gateway, graceful_s=graceful_s) as running:
        yield running
