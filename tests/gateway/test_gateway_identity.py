"""Which sample a request belongs to: by its conversation (repeats of a task are distinct samples,
even when they start at the same instant), explicit ids first, bad ids refused with nothing written."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
from gateway_helpers import MODEL, gateway_config, serve_gateway, sim_workers
from mcp import Client

from agentbatch.db.store import Store
from agentbatch.environments.mcp_client import McpServerSpec
from agentbatch.gateway.identity import ConversationTree, SampleIdError, check_sample_id

SYSTEM = {"role": "system", "content": "You are terse."}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]}


def test_tree_repeats_are_distinct_and_continuations_found():
    tree = ConversationTree()
    opening = [SYSTEM, {"role": "user", "content": "task 7"}]
    first, second = tree.claim(opening), tree.claim(opening)  # two epochs, same instant
    assert first.startswith("conv-") and second == first + "-2"
    tree.done(first, answered=True)
    tree.done(second, answered=True)
    # The harness sends the assistant message back rebuilt (arguments re-serialized, fields added).
    rebuilt = {**CALL, "content": "", "refusal": None, "tool_calls": [
        {**CALL["tool_calls"][0], "function": {"name": "lookup", "arguments": "{\"q\":1}"}}]}
    turn2 = [*opening, rebuilt, {"role": "tool", "tool_call_id": "call_1", "content": "r"}]
    a, b = tree.claim(turn2), tree.claim(turn2)
    assert {a, b} == {first, second}  # each continuation goes to one of the two, never both to one
    tree.done(a, answered=False)
    assert tree.claim(turn2) == a  # a retry of an unanswered request stays in its sample
    assert tree.claim(turn2) not in (a, b)  # a third run of the same messages is a new sample
    assert tree.claim([{"role": "user", "content": "other"}]).startswith("conv-")
    assert len(tree) == 4


def test_tree_prefers_the_deepest_conversation():
    tree = ConversationTree()
    short = tree.claim([{"role": "user", "content": "q"}])
    tree.done(short, answered=True)
    long_ = tree.claim([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "q2"}])
    assert long_ == short  # it extends the first
    tree.done(long_, answered=True)
    other = tree.claim([{"role": "user", "content": "q"}])  # a new run of the same task
    tree.done(other, answered=True)
    deeper = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
              {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "3"}]
    assert tree.claim(deeper) == short


@pytest.mark.parametrize(("value", "reason"), [("", "empty"), ("x" * 201, "201 characters"),
                                                ("a\x00b", "control character"), ("a\nb", "control character")])
def test_bad_sample_ids_are_named(value, reason):
    with pytest.raises(SampleIdError, match=reason):
        check_sample_id(value, "field `user`")
    assert check_sample_id("x" * 200, "header") == "x" * 200


async def _epoch(http: httpx.AsyncClient, task: int, epoch: int) -> list[int]:
    """One run of a task without any sample id: a tool call, then the final answer."""
    messages = [SYSTEM, {"role": "user", "content": f"task {task}"}]
    first = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                          "agentbatch_response": CALL})
    messages += [first.json()["choices"][0]["message"],
                 {"role": "tool", "tool_call_id": "call_1", "content": f"result of epoch {epoch}"}]
    second = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 3})
    return [first.status_code, second.status_code]


def test_epochs_of_one_task_are_distinct_samples_with_their_own_conversations(db_url):
    """2 tasks x 2 epochs, all four started together with identical openings and identical first
    answers: four samples, each with its two steps and its own epoch's messages."""
    store = Store(db_url)
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints, max_active_samples=8), endpoints) as gw:

            async def main() -> list[list[int]]:
                async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
                    return await asyncio.gather(*(_epoch(http, t, e) for t in (1, 2) for e in (1, 2)))

            assert asyncio.run(main()) == [[200, 200]] * 4
            batch_id = gw.batch_id
    samples = store.samples(batch_id)
    assert len(samples) == 4 and len({s.task_id for s in samples}) == 4
    steps = store.steps(batch_id)
    epochs_seen = []
    for sample in samples:
        mine = sorted((s for s in steps if s.sample_id == sample.id), key=lambda s: s.index)
        assert [s.index for s in mine] == [0, 1] and all(s.status == "completed" for s in mine)
        history = [m for s in mine for m in s.request["messages"]]
        assert len(history) == 4 and history[1]["content"].startswith("task ")
        epochs_seen.append((history[1]["content"], history[3]["content"]))
        assert sample.steps_done == 2 and sample.result["ended"] == "answer"
    assert sorted(epochs_seen) == [(f"task {t}", f"result of epoch {e}") for t in (1, 2) for e in (1, 2)]


UPSTREAM = McpServerSpec(name="probe", command=sys.executable,
                         args=["-m", "agentbatch.environments.mcp_servers.probe_server"])


def test_bad_ids_are_refused_and_nothing_is_written(db_url):
    store = Store(db_url)
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with sim_workers(1) as endpoints:
        with serve_gateway(store, gateway_config(endpoints), endpoints, upstreams=[UPSTREAM]) as gw:
            url = gw.base_url + "/v1/chat/completions"
            too_long = httpx.post(url, json=chat, headers={"X-Agentbatch-Sample": "s" * 201})
            nul = httpx.post(url, json={**chat, "user": "a\x00b"})
            meta = httpx.post(url, json={**chat, "metadata": {"session_id": "x" * 300}})
            finish = httpx.post(gw.base_url + "/v1/samples/" + "f" * 250 + "/finish")

            async def tool() -> object:
                async with Client(gw.base_url + "/mcp") as client:
                    return await client.call_tool("echo", {"text": "hi"}, meta={"agentbatch/sample": "t" * 201})

            tool_result = asyncio.run(tool())
            status = httpx.get(gw.base_url + "/v1/batch").json()
            batch_id = gw.batch_id
    for response, reason in ((too_long, "201 characters"), (nul, "control character"), (meta, "300 characters"),
                             (finish, "250 characters")):
        assert response.status_code == 400 and reason in response.json()["error"]["message"]
    assert tool_result.is_error and "201 characters" in tool_result.content[0].text
    assert status["samples"] == 0 and status["in_use"]["admission"] == 0
    assert store.samples(batch_id) == [] and store.steps(batch_id) == []
    assert store.get_batch(batch_id).status == "completed"
