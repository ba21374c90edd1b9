"""BFCL multi-turn environment: real backends, per-sample instances, the official checker."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentbatch.engines.scripted import build_scripted_workers
from agentbatch.environments.bfcl import CATEGORIES, BfclWorkload, parse_call, to_openai_tool
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import TaskSpec
from agentbatch.tasks.agent import AgentState

NO_WAIT = {"timing": {"kind": "token", "scale": 0}}


async def play(workload: BfclWorkload, task: TaskSpec, drop_call: int | None = None) -> tuple[dict, AgentState]:
    """Run one task with the scripted engine; optionally drop the n-th tool call (corruption)."""
    engine = build_scripted_workers(NO_WAIT, workload)[0]
    env = workload.create(task)
    state = AgentState.start(await env.reset(task))
    n_calls = 0
    while not state.done:
        result = await engine.complete(ChatRequest(state.messages, state.tools, task_id=task.task_id,
                                                   step_index=state.step_index))
        message = result.message
        calls = message.get("tool_calls") or []
        if drop_call is not None and calls and n_calls <= drop_call < n_calls + len(calls):
            # replace the dropped call by a harmless one so the scripted engine moves on
            message = {**message, "tool_calls": [{**calls[0], "function": {"name": "pwd", "arguments": "{}"}}]}
        n_calls += len(calls)
        state.apply_inference(message)
        env_result = await env.step(message)
        state.apply_environment(env_result.messages, env_result.done, env_result.info.get("tools"))
    return await env.score(), state


def test_all_categories_present() -> None:
    tasks = BfclWorkload().tasks()
    assert len(tasks) == 800
    assert {t.data["category"] for t in tasks} == set(CATEGORIES)


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_scores_full_marks_with_official_checker(category: str) -> None:
    workload = BfclWorkload(categories=[category], limit=6, seed=1)
    for task in workload.tasks():
        score, state = asyncio.run(play(workload, task))
        assert score["score"] == 1.0, (task.task_id, score)
        assert any(m["role"] == "tool" for m in state.messages)


def test_corrupted_trajectory_is_rejected_by_checker() -> None:
    workload = BfclWorkload(task_ids=["multi_turn_base_0", "multi_turn_base_5", "multi_turn_miss_param_3"])
    for task in workload.tasks():
        score, _ = asyncio.run(play(workload, task, drop_call=0))
        assert score["score"] == 0.0, task.task_id


def test_tool_schemas_are_openai_objects() -> None:
    workload = BfclWorkload(task_ids=["multi_turn_long_context_1"])
    env = workload.create(workload.tasks()[0])
    reset = asyncio.run(env.reset(workload.tasks()[0]))
    text = json.dumps(reset.tools)
    assert '"type": "dict"' not in text
    assert all(t["function"]["parameters"]["type"] == "object" for t in reset.tools)


def test_miss_func_turn_adds_the_held_out_tools() -> None:
    workload = BfclWorkload(task_ids=["multi_turn_miss_func_0"])
    task = workload.tasks()[0]
    score, state = asyncio.run(play(workload, task))
    assert score["score"] == 1.0
    assert "sort" in {t["function"]["name"] for t in state.tools}
    assert any("updated some more functions" in (m.get("content") or "") for m in state.messages)


def test_instances_are_per_sample() -> None:
    """Two samples of the same task do not share backend state (bfcl's global cache would)."""
    workload = BfclWorkload(task_ids=["multi_turn_base_0"])
    task = workload.tasks()[0]
    a, b = workload.create(task), workload.create(task)
    asyncio.run(a.reset(task))
    asyncio.run(b.reset(task))
    call = {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "mkdir", "arguments": '{"dir_name": "only_in_a"}'}}]}
    asyncio.run(a.step(call))
    ls = {"role": "assistant", "tool_calls": [{"id": "2", "type": "function",
                                                "function": {"name": "ls", "arguments": "{}"}}]}
    assert "only_in_a" in asyncio.run(a.step(ls)).messages[0]["content"]
    assert "only_in_a" not in asyncio.run(b.step(ls)).messages[0]["content"]


def test_tool_error_is_an_observation() -> None:
    workload = BfclWorkload(task_ids=["multi_turn_base_0"])
    task = workload.tasks()[0]
    env = workload.create(task)
    asyncio.run(env.reset(task))
    bad = {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "no_such_tool", "arguments": "{}"}},
        {"id": "2", "type": "function", "function": {"name": "cd", "arguments": "not json"}}]}
    result = asyncio.run(env.step(bad))
    assert result.tool_errors == 2 and not result.done
    assert all(m["content"].startswith("Error during execution") for m in result.messages)


def test_parse_call_names_positional_arguments() -> None:
    tools = [to_openai_tool({"name": "sort", "parameters": {"type": "dict", "properties": {"file_name": {}}}})]
    assert parse_call("sort('a.txt')", tools) == ("sort", {"file_name": "a.txt"})
    assert parse_call("sort(file_name='b')", tools) == ("sort", {"file_name": "b"})
    with pytest.raises(ValueError):
        parse_call("x = 1", tools)
