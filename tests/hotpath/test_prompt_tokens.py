"""ChatPrompt (cached per-message tokens) equals tokenizing the whole rendered chat."""

from __future__ import annotations

import json
import random

from agentbatch.protocols.tokens import ChatPrompt, chat_tokens, render_chat, tokenize

PIECES = ["hello", " world", '{"a": 1}', "  \n", "<|x|>", "éü", "tab\t", "...", " ", "", "x y z", "<|end|>"]


def _chat(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    messages = []
    for _ in range(rng.randint(0, 6)):
        m: dict = {"role": rng.choice(["user", "assistant", "tool"]),
                   "content": "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8))) or None}
        if rng.random() < 0.3:
            m["tool_calls"] = [{"function": {"name": "f", "arguments": json.dumps({"k": rng.choice(PIECES)})}}]
        messages.append(m)
    tools = [{"name": "t", "description": rng.choice(PIECES)}] if rng.random() < 0.5 else None
    return messages, tools


def test_cached_prompt_tokens_equal_whole_chat_tokens() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        messages, tools = _chat(rng)
        whole = tokenize(render_chat(messages, tools))
        prompt = ChatPrompt(messages, tools)
        assert chat_tokens(messages, tools) == whole
        assert len(prompt) == len(whole) and list(prompt) == whole and prompt[-1:] == whole[-1:]


def test_tools_memo_follows_the_list_object_not_a_stale_entry() -> None:
    tools = [{"name": "a"}]
    first = len(ChatPrompt([], tools))
    other = [{"name": "a much longer tool name with many words in it"}]
    assert len(ChatPrompt([], other)) > first
    assert len(ChatPrompt([], tools)) == first
