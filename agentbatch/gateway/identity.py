"""Which agent sample a request belongs to.

An explicit id wins. Inference requests: the `X-Agentbatch-Sample` header, else the OpenAI `user`
field, else a session id in `metadata` (`agentbatch_sample`, `session_id` or `sample_id`). Tool
calls: the same header, else `agentbatch/sample` in the call's `_meta`, else the MCP session id.
Ids are checked (`check_sample_id`): a bad one is refused before anything is written.

Without an id, an inference request belongs to the sample whose recorded conversation it extends
(`ConversationTree`, a prefix tree of the conversations, as prefix-caching routers keep one): every
request of a conversation repeats the previous request's messages and adds to them. A request that
extends none starts a new sample, so two runs of one task (inspect `epochs=2`, any harness that
repeats a task) are two samples even when they open with the same messages at the same instant.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SAMPLE_HEADER = "x-agentbatch-sample"
METADATA_KEYS = ("agentbatch_sample", "session_id", "sample_id")
MCP_META_KEY = "agentbatch/sample"
MCP_SESSION_HEADER = "mcp-session-id"
MAX_SAMPLE_ID = 200  # the store's `task_id` column
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SampleIdError(ValueError):
    """An explicit sample id the gateway refuses (the message says why)."""


def check_sample_id(value: str, source: str) -> str:
    """`value` when it can name a sample: 1..200 characters, no control characters."""
    if not value.strip():
        raise SampleIdError(f"{source}: the sample id is empty")
    if len(value) > MAX_SAMPLE_ID:
        raise SampleIdError(f"{source}: the sample id has {len(value)} characters; at most {MAX_SAMPLE_ID}")
    if bad := _CONTROL.search(value):
        raise SampleIdError(f"{source}: the sample id contains the control character {bad.group()!r}")
    return value


def explicit_inference_id(headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
    """The sample id the request names, if any (checked: SampleIdError when it is bad)."""
    if (value := headers.get(SAMPLE_HEADER)) is not None:
        return check_sample_id(value, "header X-Agentbatch-Sample")
    user = body.get("user")
    if isinstance(user, str) and user:
        return check_sample_id(user, "field `user`")
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        for key in METADATA_KEYS:
            value = metadata.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
                return check_sample_id(str(value), f"field `metadata.{key}`")
    return None


def tool_sample_key(headers: Mapping[str, str] | None, meta: Mapping[str, Any] | None) -> str:
    """The sample of a tool call (checked: SampleIdError when the id it names is bad)."""
    if headers is not None and (value := headers.get(SAMPLE_HEADER)) is not None:
        return check_sample_id(value, "header X-Agentbatch-Sample")
    if meta is not None and (value := meta.get(MCP_META_KEY)) is not None:
        return check_sample_id(str(value), f"_meta[{MCP_META_KEY!r}]")
    if headers is not None and (session := headers.get(MCP_SESSION_HEADER)):
        return f"mcp-{session}"
    return "mcp-anonymous"


def _fingerprint(message: Any) -> str:
    """What identifies a message when the harness sends it back: role, text, tool call ids and names.
    Not the exact bytes: harnesses rebuild the assistant messages they got (arguments re-serialized,
    empty fields dropped or added)."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text") or "" if isinstance(p, dict) else str(p) for p in content)
    calls = [(c.get("id"), (c.get("function") or {}).get("name")) for c in message.get("tool_calls") or []
             if isinstance(c, dict)]
    return json.dumps([message.get("role"), content or "", message.get("tool_call_id"), calls], default=str)


def opening_hash(messages: list[Any]) -> str:
    """A short stable hash of a conversation's opening (the messages up to the first user message)."""
    head: list[Any] = []
    for message in messages:
        head.append(_fingerprint(message))
        if isinstance(message, dict) and message.get("role") == "user":
            break
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()[:16]


@dataclass(eq=False)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)  # samples whose last request ended here


class ConversationTree:
    """The conversations of the samples known only by their messages, as a prefix tree.

    Each such sample sits at the node of its last request's messages. A request is claimed by the
    sample deepest on its path whose request it extends (more messages), and that has no request
    in flight; the same messages again are claimed only by a sample whose last request got no
    answer (the harness retrying it). Otherwise the request starts a new sample, named
    `conv-<hash of the opening>` and `-2`, `-3`, ... for later runs of the same opening. Claiming
    is synchronous: two requests that arrive together never claim one sample.
    """

    def __init__(self) -> None:
        self.root = _Node()
        self._at: dict[str, _Node] = {}
        self._busy: set[str] = set()
        self._unanswered: set[str] = set()
        self._openings: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._at)

    def claim(self, messages: list[Any]) -> str:
        """The sample `messages` belongs to (new or known), now marked as having a request in flight."""
        path = [_fingerprint(m) for m in messages]
        node, best = self.root, None
        for depth, fp in enumerate(path, 1):
            child = node.children.get(fp)
            if child is None:
                break
            node = child
            free = [k for k in node.samples if k not in self._busy
                    and (depth < len(path) or k in self._unanswered)]
            if free:
                best = free[0]
        key = best if best is not None else self._new_key(messages)
        self._move(key, path)
        self._busy.add(key)
        return key

    def done(self, key: str, *, answered: bool) -> None:
        """The sample's request ended; without an answer the same request may come again."""
        self._busy.discard(key)
        (self._unanswered.discard if answered else self._unanswered.add)(key)

    def _new_key(self, messages: list[Any]) -> str:
        opening = opening_hash(messages)
        n = self._openings[opening] = self._openings.get(opening, 0) + 1
        return f"conv-{opening}" if n == 1 else f"conv-{opening}-{n}"

    def _move(self, key: str, path: list[str]) -> None:
        if (old := self._at.get(key)) is not None:
            old.samples.remove(key)
        node = self.root
        for fp in path:
            node = node.children.setdefault(fp, _Node())
        node.samples.append(key)
        self._at[key] = node
