"""Talking to the engine workers: request bodies, response accounting, SSE pass-through.

The gateway forwards the harness's request body as it came (every field the worker understands
still works) with three changes: `model` is the chosen worker's model, `priority` is the
coordinator's chain-progress priority (vLLM `--scheduling-policy priority`), and `user` names the
sample when the harness did not set it (the simulated server keys its per-sample state on it). When
none of them replaces a value the harness sent, its bytes go out as they came, the missing fields
appended (`WorkerPool.body_for`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.step_records import StepOutcome, inference_response
from agentbatch.engines.openai_http import endpoint_auth
from agentbatch.gateway import http1, jsonio


@dataclass(slots=True)
class WorkerEndpoint:
    name: str
    base_url: str
    model: str
    api_key: str | None = None


class WorkerAnswer:
    """A worker's answer as it comes in: its status now, its body read whole (`read`) or piece by piece
    (`pieces`); `release` gives its connection back (kept when the body was read to its end)."""

    def __init__(self, pool: http1.Pool, conn: http1.Connection, timeout_s: float) -> None:
        self._pool, self._conn, self._timeout_s = pool, conn, timeout_s
        self.status = conn.status
        self._released = False

    async def read(self) -> bytes:
        return await self._conn.read(self._timeout_s)

    def pieces(self) -> AsyncIterator[bytes]:
        return self._conn.pieces(self._timeout_s)

    def release(self) -> None:
        """Once (later calls do nothing)."""
        if not self._released:
            self._released = True
            self._pool.release(self._conn)


class WorkerPool:
    """Kept-alive HTTP/1.1 connections to each worker (`http1.py`: a third of an aiohttp session's CPU
    per request)."""

    def __init__(self, endpoints: list[WorkerEndpoint], timeout_s: float = 600.0) -> None:
        if not endpoints:
            raise ValueError("the gateway needs at least one engine worker endpoint")
        self.endpoints = {e.name: e for e in endpoints}
        auth = {e.name: endpoint_auth(e.base_url, e.api_key) for e in endpoints}
        self.urls = {name: url + "/chat/completions" for name, (url, _) in auth.items()}
        self._pools = {name: http1.Pool(url) for name, url in self.urls.items()}
        self._heads = {name: self._pools[name].head({k: v for k, v in headers.items()
                                                     if k.lower() not in ("host", "content-length")})
                       for name, (_, headers) in auth.items()}
        self.timeout_s = timeout_s  # to connect, and for each wait on the worker's next bytes

    async def post(self, worker: str, body: bytes) -> WorkerAnswer:
        """POST a chat request to the worker; returns once the answer's head is in (read its body or
        stream it, then release it). Raises one of TRANSPORT_ERRORS when the worker is unreachable,
        cuts the connection or is late."""
        pool = self._pools[worker]
        conn = await pool.post(self._heads[worker], body, self.timeout_s)
        return WorkerAnswer(pool, conn, self.timeout_s)

    @property
    def models(self) -> list[str]:
        return sorted({e.model for e in self.endpoints.values()})

    def body_for(self, worker: str, body: dict[str, Any], *, priority: int | None, user: str,
                 raw: bytes | None = None) -> bytes:
        """The request for `worker`. `raw`: the harness's bytes of `body` when keys can be appended to
        them (`jsonio.loads_passable`); they are passed on as they came when no field the gateway sets
        replaces a different value in them (the fields it lacks appended), else `body` is serialised."""
        fields: dict[str, Any] = {"model": self.endpoints[worker].model}
        if priority is not None:
            fields["priority"] = priority
        if "user" not in body:
            fields["user"] = user
        if body.get("stream"):
            # Usage comes only in a last chunk the client asks for; the gateway always asks
            # (and drops that chunk again when the client did not).
            fields["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        added = {k: v for k, v in fields.items() if not _same(body.get(k, _MISSING), v)}
        if raw is not None and not any(k in body for k in added):
            return jsonio.add_keys(raw, added)
        return jsonio.dumps({**body, **fields})

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()


_MISSING = object()


def _same(sent: Any, value: Any) -> bool:
    """The harness sent this very value (of the same JSON type: `true` is not `1`)."""
    if isinstance(value, dict):
        return isinstance(sent, dict) and sent.keys() == value.keys() and all(
            _same(sent[k], v) for k, v in value.items())
    return type(sent) is type(value) and sent == value


TRANSPORT_ERRORS = http1.ERRORS  # the worker unreachable, gone mid-answer or late


def outcome_of(data: dict[str, Any], message: dict[str, Any] | None, worker: str) -> StepOutcome:
    """The step record of a chat-completions answer: the assistant message and the accounting
    (usage, cached tokens, and the simulated server's engine-side timing split when present)."""
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    split = data.get("agentbatch") or {}
    choice = (data.get("choices") or [{}])[0]
    if message is None:
        message = choice.get("message") or {}
    cached = details.get("cached_tokens")
    return StepOutcome(
        response=inference_response(message, choice.get("finish_reason"), data.get("id")),
        prompt_tokens=_int(usage.get("prompt_tokens")),
        cached_prompt_tokens=_int(cached),
        output_tokens=_int(usage.get("completion_tokens")),
        recomputed_tokens=_int(split.get("recomputed_tokens")),
        prefill_s=_float(split.get("prefill_s")),
        decode_s=_float(split.get("decode_s")),
        engine_queue_s=_float(split.get("queue_s")),
        worker=worker,
    )


def is_answer(message: dict[str, Any]) -> bool:
    """A final answer: an assistant message that calls no tool."""
    return not message.get("tool_calls")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass
class StreamAccumulator:
    """Rebuild the assistant message and the usage from a chat-completions SSE stream."""

    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    last: dict[str, Any] = field(default_factory=dict)  # id, model, usage, agentbatch split
    _buffer: bytes = b""

    def feed(self, raw: bytes, *, keep_usage_chunk: bool = True) -> bytes:
        """Take bytes from the worker; return the bytes to pass on (whole events only)."""
        *events, self._buffer = (self._buffer + raw.replace(b"\r\n", b"\n")).split(b"\n\n")
        return b"".join(event + b"\n\n" for event in events if self._event(event) or keep_usage_chunk)

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest

    def _event(self, event: bytes) -> bool:
        """Account for one event; False for a usage-only chunk (no choices)."""
        if event.startswith(b"data:") and b"\n" not in event:  # the usual event: one data line
            data = event[5:].strip()
        else:
            data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            return True
        try:
            chunk = jsonio.loads(data)
        except ValueError:
            return True
        for key in ("id", "usage", "agentbatch"):
            if chunk.get(key):
                self.last[key] = chunk[key]
        choices = chunk.get("choices") or []
        for choice in choices:
            self._delta(choice.get("delta") or {})
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return bool(choices)

    def _delta(self, delta: dict[str, Any]) -> None:
        if delta.get("content"):
            self.content.append(delta["content"])
        for i, call in enumerate(delta.get("tool_calls") or []):
            slot = self.tool_calls.setdefault(call.get("index", i), {"id": None, "type": "function",
                                                                     "function": {"name": "", "arguments": ""}})
            slot["id"] = call.get("id") or slot["id"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message

    def data(self) -> dict[str, Any]:
        """The stream as a non-streamed answer's fields (for `outcome_of`)."""
        return {**self.last, "choices": [{"finish_reason": self.finish_reason}]}
