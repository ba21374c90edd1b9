"""Which agent sample a request belongs to.

Inference requests: the `X-Agentbatch-Sample` header, else the OpenAI `user` field, else a session
id in `metadata` (`agentbatch_sample`, `session_id` or `sample_id`), else a stable hash of the
conversation's first messages (up to and including the first user message), which every later
request of the same conversation repeats. Tool calls: the same header, else `agentbatch/sample` in
the call's `_meta`, else the MCP session id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SAMPLE_HEADER = "x-agentbatch-sample"
METADATA_KEYS = ("agentbatch_sample", "session_id", "sample_id")
MCP_META_KEY = "agentbatch/sample"
MCP_SESSION_HEADER = "mcp-session-id"


def conversation_hash(messages: Any) -> str:
    """A stable id of a conversation from its opening: the messages up to the first user message."""
    head: list[Any] = []
    for message in messages if isinstance(messages, list) else []:
        head.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode()).hexdigest()
    return f"conv-{digest[:16]}"


def inference_sample_key(headers: Mapping[str, str], body: dict[str, Any]) -> str:
    if value := headers.get(SAMPLE_HEADER):
        return value
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        for key in METADATA_KEYS:
            value = metadata.get(key)
            if isinstance(value, str | int) and str(value):
                return str(value)
    return conversation_hash(body.get("messages"))


def tool_sample_key(headers: Mapping[str, str] | None, meta: Mapping[str, Any] | None) -> str:
    if headers is not None and (value := headers.get(SAMPLE_HEADER)):
        return value
    if meta is not None and (value := meta.get(MCP_META_KEY)):
        return str(value)
    if headers is not None and (session := headers.get(MCP_SESSION_HEADER)):
        return f"mcp-{session}"
    return "mcp-anonymous"
