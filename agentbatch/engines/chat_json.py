"""A chat request's JSON body, each message encoded once per conversation.

A sample's conversation grows by a few messages a step while everything before them (an 8 k-token
system prompt, every earlier turn) stays as it was, and its tool schemas rarely change. The runner
keeps its messages in a `Conversation`, which remembers the JSON of the messages and of the tool
schemas it has encoded, so a request body costs the encoding of the new messages and a join, not a
`json.dumps` of the whole conversation (bench/cluster_rate.py). The body is byte for byte what
`json.dumps(payload, ensure_ascii=False, allow_nan=False)` gives.

Messages are not changed once they are in a conversation (the store records them as they were
appended, too): a message replaced, removed or inserted is noticed (by identity) and encoded again,
a message dict changed in place is not. Likewise a changed tool set is a new list (`AgentState`).
"""

from __future__ import annotations

import json
from typing import Any

from agentbatch.protocols.engine import Message, ToolSchema

# json.dumps(value, ensure_ascii=False, allow_nan=False), without building an encoder per call
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


class Conversation(list[Message]):
    """The messages of one chat, and the JSON of those encoded so far."""

    __slots__ = ("_encoded", "_chunks", "_tools", "_tools_json")

    def __init__(self, messages: Any = ()) -> None:
        super().__init__(messages)
        self._encoded: list[Message] = []  # the messages whose JSON is in _chunks, in order
        self._chunks: list[bytes] = []  # each message's JSON, after the first with its ", " before it
        self._tools: list[ToolSchema] | None = None  # the tool list whose JSON is _tools_json
        self._tools_json = b""

    def message_chunks(self) -> list[bytes]:
        """The JSON array of the messages without its brackets, in pieces to join (not to change)."""
        encoded, chunks = self._encoded, self._chunks
        keep = 0
        for old, new in zip(encoded, self, strict=False):  # the prefix encoded before, by identity
            if old is not new:
                break
            keep += 1
        if keep < len(encoded):  # changed other than by appending: encoded again from there
            del encoded[keep:], chunks[keep:]
        for message in self[keep:]:
            chunks.append((b", " if chunks else b"") + _dumps(message).encode())
            encoded.append(message)
        return chunks

    def tools_json(self, tools: list[ToolSchema]) -> bytes:
        """The JSON of this conversation's tool list (encoded again when the list is another one)."""
        if tools is not self._tools:
            self._tools, self._tools_json = tools, _dumps(tools).encode()
        return self._tools_json


def request_body(payload: dict[str, Any]) -> bytes:
    """`payload` as JSON bytes; its messages and tools from their `Conversation`'s cache when they
    are one's, joined into the body in one copy."""
    messages = payload.get("messages")
    if not isinstance(messages, Conversation):
        return _dumps(payload).encode()
    pieces: list[bytes] = []
    for key, value in payload.items():
        pieces.append(f"{', ' if pieces else '{'}{_dumps(key)}: ".encode())
        if value is messages:
            pieces.append(b"[")
            pieces += messages.message_chunks()
            pieces.append(b"]")
        elif key == "tools" and isinstance(value, list):
            pieces.append(messages.tools_json(value))
        else:
            pieces.append(_dumps(value).encode())
    pieces.append(b"}")
    return b"".join(pieces)
