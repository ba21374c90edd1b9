"""Requests that reach a gateway process whose sample another process owns go to the owner.

With several processes (`gateway/cluster.py`) every process listens on the public port
(SO_REUSEPORT: the kernel spreads the connections) and on an internal one. A chat request is
identified as the gateway identifies it (`identity.py`: the explicit id, else the opening of the
conversation, which every later request of the conversation repeats) and, when another process owns
that sample, forwarded to the owner's internal port as it came, its answer (or SSE stream) passed
back as it goes (over this process's own kept-alive connections to each owner, `http1.py`). A
sample's finish goes to its owner; a batch finish goes to every process. Tool
calls are forwarded one level deeper (`ToolGateway`): the MCP session stays with the process that
holds it, the call runs on the process that owns the call's sample.

Why forwarding and not one front process: a front process would carry every request's bytes and
parse every body on one core, which caps the whole gateway at one core's rate; with forwarding each
process parses the bodies of its own connections and the owner does the rest.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from agentbatch.gateway import http1, jsonio
from agentbatch.gateway.cluster import ROUTED_HEADER, Cluster
from agentbatch.gateway.identity import SAMPLE_HEADER, SampleIdError, explicit_inference_id, opening_hash

# Hop-by-hop headers, and those the forwarding sets itself.
_DROPPED = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}


# The scope key under which the router keeps its parse of a chat body, (the bytes, `jsonio.loads_passable`'s
# result), so the handler in this process does not parse the body a second time.
PARSED_BODY = "agentbatch.parsed_body"


def routing_key(headers: dict[str, str], body: bytes, scope: dict[str, Any] | None = None) -> str | None:
    """The sample key a chat request routes by (None: not a request the gateway would take); the body's
    parse, when it took one, is kept in `scope`."""
    if (value := headers.get(SAMPLE_HEADER)) is not None:
        return value  # checked by the owner, which answers a bad one
    try:
        parsed = jsonio.loads_passable(body)
    except ValueError:
        return None
    if scope is not None:
        scope[PARSED_BODY] = (body, parsed)
    data = parsed[0]
    try:
        explicit = explicit_inference_id(headers, data)
    except (SampleIdError, AttributeError, TypeError):
        return None
    if explicit is not None:
        return explicit
    messages = data.get("messages")
    return f"conv-{opening_hash(messages)}" if isinstance(messages, list) and messages else None


class ClusterRouter:
    """ASGI middleware (inside `Guard`, which has read the body): forward to the owner, or serve here."""

    def __init__(self, app: Any, cluster: Cluster) -> None:
        self.app = app
        self.cluster = cluster
        self._owners: dict[str, http1.Pool] = {}  # by the owner's base URL

    async def aclose(self) -> None:
        for pool in self._owners.values():
            pool.close()

    async def _post(self, base_url: str, path: str, headers: dict[str, str], body: bytes) -> tuple[http1.Pool,
                                                                                                  http1.Connection]:
        """POST to a process; returns once the answer's head is in (read its body, then release it)."""
        pool = self._owners.get(base_url)
        if pool is None:
            pool = self._owners[base_url] = http1.Pool(base_url)
        conn = await pool.post(pool.head(headers, path), body)
        return pool, conn

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # A tool call (/mcp) is routed by the tool gateway, once it knows the call's sample.
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] == "/mcp":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if ROUTED_HEADER in headers:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/v1/batch/finish":
            for url in self.cluster.others():
                with contextlib.suppress(*http1.ERRORS):
                    pool, conn = await self._post(url, path, {ROUTED_HEADER: "1"}, b"")
                    try:
                        await conn.read()
                    finally:
                        pool.release(conn)
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"")
        key: str | None = None
        if path == "/v1/chat/completions":
            key = routing_key(headers, body, scope)
        elif path.startswith("/v1/samples/") and path.endswith("/finish"):
            key = path[len("/v1/samples/"):-len("/finish")]
        owner_url = self.cluster.url_of(key) if key is not None else None
        if owner_url is None:
            sent = False

            async def replay() -> Any:
                nonlocal sent
                if not sent:
                    sent = True
                    return message
                return await receive()

            await self.app(scope, replay, send)
            return
        await self._forward(owner_url, path, headers, body, send)

    async def _forward(self, owner_url: str, path: str, headers: dict[str, str], body: bytes, send: Any) -> None:
        out = {k: v for k, v in headers.items() if k not in _DROPPED}
        out[ROUTED_HEADER] = "1"
        try:
            pool, conn = await self._post(owner_url, path, out, body)
            try:
                passed = [(b"content-type", conn.content_type.encode("latin-1"))] if conn.content_type else []
                await send({"type": "http.response.start", "status": conn.status, "headers": passed})
                async for chunk in conn.pieces():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                pool.release(conn)
        except http1.ERRORS as exc:
            error = json.dumps({"error": {"message": f"the gateway process owning this sample is unreachable: {exc}",
                                          "type": "BadGatewayError", "code": 502}}).encode()
            with contextlib.suppress(Exception):
                await send({"type": "http.response.start", "status": 502,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": error, "more_body": False})
