"""inspect_ai as a first-class client: the real inspect_ai runs a task through the gateway with the
`agentbatch/<model>` provider of integrations/inspect_agentbatch (found through inspect's own entry
point), its MCP tools through `/mcp`, against serve-sim workers. Each sample and epoch is a sample
of the batch with its own conversation, its tool calls and its inspect score."""

from __future__ import annotations

import json
import sys

import inspect_agentbatch
from gateway_helpers import MODEL, gateway_config, serve_gateway, sim_workers
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig, execute_tools, get_model
from inspect_ai.scorer import match
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.tool import Tool, tool

from agentbatch.db.store import Store
from agentbatch.environments.mcp_client import McpServerSpec

PROBE = McpServerSpec(name="probe", command=sys.executable,
                      args=["-m", "agentbatch.environments.mcp_servers.probe_server"])
WORDS = {"a": "alpha", "b": "bravo", "c": "charlie"}


@tool
def submit() -> Tool:
    async def execute(answer: str) -> str:
        """Submit the final answer.

        Args:
            answer: The answer.
        """
        return answer

    return execute


def _call(n: int, name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


@solver
def echo_then_submit():
    """A react-style loop whose model turns are scripted for the simulated worker: call the MCP tool
    `echo`, then `submit` what it returned. The last turn is a tool call; nobody calls /finish."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        tools = [inspect_agentbatch.gateway_mcp_server(), submit()]
        model = get_model()
        word = state.input_text.split()[-1]
        scripted = [_call(1, "echo", {"text": word})]
        for n in range(2):
            output = await model.generate(state.messages, tools,
                                          config=GenerateConfig(extra_body={"agentbatch_response": scripted[n]}))
            state.messages.append(output.message)
            result = await execute_tools(state.messages, tools)
            state.messages.extend(result.messages)
            echoed = result.messages[-1].text
            scripted.append(_call(2, "submit", {"answer": echoed}))
        state.output.completion = state.messages[-1].text
        return state

    return solve


def test_inspect_eval_with_epochs_runs_through_the_gateway(sqlite_url, tmp_path):
    task = Task(dataset=MemoryDataset([Sample(id=k, input=f"echo {w}", target=w if k != "c" else "delta")
                                       for k, w in WORDS.items()]),
                solver=echo_then_submit(), scorer=match(), epochs=2, name="echo")
    store = Store(sqlite_url)
    with sim_workers(2) as endpoints:
        config = gateway_config(endpoints, max_active_samples=2, env_slots=2)
        with serve_gateway(store, config, endpoints, upstreams=[PROBE]) as gw:
            (log,) = inspect_eval(task, model=f"agentbatch/{MODEL}", model_base_url=gw.base_url,
                                  log_dir=str(tmp_path / "logs"), display="none", max_samples=6)
            batch_id = gw.batch_id
    assert log.status == "success", log.error
    inspect_scores = {f"echo/{s.id}/{s.epoch}": s.scores["match"].value for s in log.samples}
    assert len(inspect_scores) == 6
    samples = {s.task_id: s for s in store.samples(batch_id)}
    assert sorted(samples) == sorted(inspect_scores)  # one sample per inspect sample and epoch
    steps = store.steps(batch_id)
    for key, row in samples.items():
        assert row.result["ended"] == "finish" and row.score == (1.0 if inspect_scores[key] == "C" else 0.0)
        mine = sorted((s for s in steps if s.sample_id == row.id), key=lambda s: s.index)
        assert [(s.kind, s.status) for s in mine] == [("inference", "completed"), ("environment", "completed"),
                                                      ("inference", "completed")]
        word = WORDS[key.split("/")[1]]
        assert mine[1].request["calls"] == [{"name": "echo", "server": PROBE.name, "arguments": {"text": word}}]
        history = [m for s in mine if s.kind == "inference" for m in s.request["messages"]]
        assert history[0]["content"] == f"echo {word}"  # its own conversation, whole
        assert any(m["role"] == "tool" and m["content"] == word for m in history)
    assert sorted(inspect_scores.values()) == ["C"] * 4 + ["I"] * 2
