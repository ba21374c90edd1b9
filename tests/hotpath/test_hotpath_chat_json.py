"""A request body of a long conversation encodes only its new messages, and is byte for byte the
body `json.dumps` gives, however the conversation changed."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from agentbatch.engines import chat_json
from agentbatch.engines.chat_json import Conversation, request_body
from agentbatch.engines.openai_http import OpenAIEngine
from agentbatch.protocols.engine import ChatRequest
from agentbatch.protocols.environment import EnvReset
from agentbatch.tasks.agent import AgentState

TOOLS = [{"type": "function", "function": {"name": f"t{i}", "description": "lookup ü", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer", "default": 3}}}}}
    for i in range(4)]


def expected(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()


def message(rng: random.Random, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": rng.choice(["user", "assistant", "tool"]),
                           "content": rng.choice(["", "plain", "ünïcode \"quoted\"\n", None, f"turn {i}"])}
    if rng.random() < 0.3:
        out["tool_calls"] = [{"id": f"c{i}", "type": "function",
                              "function": {"name": "t0", "arguments": json.dumps({"q": i, "f": 0.5})}}]
    return out


def payload(engine: OpenAIEngine, conv: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return engine.payload(ChatRequest(conv, tools, sample_id=7, **kw))


def test_body_is_json_dumps_as_the_conversation_grows_and_changes() -> None:
    rng = random.Random(11)
    engine = OpenAIEngine("w", "http://127.0.0.1:9/v1", "m")
    conv = Conversation([{"role": "system", "content": "sys " * 50}, {"role": "user", "content": "task"}])
    tools = list(TOOLS)
    for step in range(200):
        change = rng.random()
        if change < 0.6:
            conv.append(message(rng, step))
        elif change < 0.7:
            conv.extend([message(rng, step), message(rng, step + 1000)])
        elif change < 0.78 and len(conv) > 1:
            conv[rng.randrange(len(conv))] = message(rng, step)  # replaced: noticed by identity
        elif change < 0.84 and len(conv) > 1:
            conv.pop(rng.randrange(len(conv)))
        elif change < 0.9:
            conv.insert(rng.randrange(len(conv) + 1), message(rng, step))
        elif change < 0.95:
            tools = tools[: rng.randrange(len(TOOLS) + 1)]  # a new tool list
        extra = {"priority": rng.choice([None, -1, 3]), "max_tokens": rng.choice([None, 64]),
                 "ignore_eos": rng.random() < 0.5}
        body = payload(engine, conv, tools, **extra)
        if rng.random() < 0.1:
            body = {**body, "seed": 3, "logprobs": True}  # keys after the messages and tools
        assert request_body(body) == expected(body), step
        assert json.loads(request_body(body))["messages"] == list(conv)


def test_each_message_and_tool_list_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[Any] = []
    real = chat_json._dumps

    def counting(value: Any) -> str:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(chat_json, "_dumps", counting)
    engine = OpenAIEngine("w", "http://127.0.0.1:9/v1", "m")
    state = AgentState.start(EnvReset(tools=list(TOOLS), messages=[{"role": "user", "content": "go"}]))
    for i in range(30):
        request_body(payload(engine, state.messages, state.tools))
        state.apply_inference({"role": "assistant", "content": f"a{i}"})
        state.apply_environment([{"role": "user", "content": f"o{i}"}], False, None)
    messages = [v for v in encoded if isinstance(v, dict) and "role" in v]
    assert len(messages) == 1 + 2 * 29  # every message once, however many requests carried it
    assert sum(v is state.tools for v in encoded) == 1


def test_plain_lists_and_bad_numbers() -> None:
    engine = OpenAIEngine("w", "http://127.0.0.1:9/v1", "m")
    plain = payload(engine, [{"role": "user", "content": "x"}], TOOLS)
    assert request_body(plain) == expected(plain)
    with pytest.raises(ValueError):
        request_body(payload(engine, Conversation([{"role": "user", "content": math.nan}]), TOOLS))
