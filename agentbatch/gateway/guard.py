"""The gateway's door: which requests reach the handlers at all.

- The `Host` header must name an allowed host (default: the bind address and localhost) on every
  route: a web page cannot reach the gateway through DNS rebinding (HTTP 421 otherwise).
- A body larger than the limit is refused before it is read (HTTP 413, from `Content-Length`, or
  as soon as a chunked body passes the limit); a body that stalls is refused after a timeout (408).
- A connection that sends no complete request head within a timeout is closed (`GuardedHTTP`), as
  is an idle keep-alive connection (uvicorn's keep-alive timeout).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names a request may name: the bind address, localhost, and `extra` ("*": any)."""
    return frozenset({bind_host, *LOCAL_HOSTS, *extra})


def host_name(header: str | None) -> str:
    """The host of a `Host` header without its port (`[::1]:80` -> `::1`)."""
    if not header:
        return ""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def mcp_security(hosts: frozenset[str]) -> Any:
    """The MCP transport's own DNS-rebinding protection, with the same hosts."""
    from mcp.server.transport_security import TransportSecuritySettings

    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = [f"[{h}]" if ":" in h else h for h in sorted(hosts)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*names, *(f"{n}:*" for n in names)],
        allowed_origins=[f"{scheme}://{n}{port}" for n in names for scheme in ("http", "https")
                         for port in ("", ":*")],
    )


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Guard:
    """ASGI middleware: the Host allow-list, the body size limit and the body read timeout."""

    def __init__(self, app: ASGIApp, *, hosts: frozenset[str], max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_head(Headers(scope=scope))
            messages = await self._read_body(receive)
        except _Refused as exc:
            response = JSONResponse({"error": {"message": str(exc), "type": "RequestRefused", "code": exc.status}},
                                    status_code=exc.status, headers={"Connection": "close"})
            await response(scope, receive, send)
            return

        async def replay() -> Message:
            return messages.popleft() if messages else await receive()

        await self.app(scope, replay, send)

    def _check_head(self, headers: Headers) -> None:
        host = host_name(headers.get("host"))
        if "*" not in self.hosts and host not in self.hosts:
            raise _Refused(421, f"Host {host!r} is not served here (allowed: {', '.join(sorted(self.hosts))})")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _Refused(413, f"request body of {declared} bytes; the limit is {self.max_body_bytes}")

    async def _read_body(self, receive: Receive) -> deque[Message]:
        """The whole body (as one message), read before the app runs, within the limits."""
        body, rest = bytearray(), deque[Message]()
        while True:
            try:
                async with asyncio.timeout(self.body_timeout_s):  # no task per message, as wait_for makes
                    message = await receive()
            except TimeoutError:
                raise _Refused(408, f"no request body data for {self.body_timeout_s:g} s") from None
            if message["type"] != "http.request":
                rest.append(message)
                break
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise _Refused(413, f"request body over the limit of {self.max_body_bytes} bytes")
            if not message.get("more_body", False):
                break
        return deque([{"type": "http.request", "body": bytes(body), "more_body": False}, *rest])


async def request_body(receive: Receive) -> bytes | None:
    """A handler's request body, whole (behind `Guard` it comes as one message); None when the client
    went away before it was in."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def guarded_http(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection that has not sent a whole request head within
    `header_timeout_s` of connecting or of its first bytes after the previous response."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedHTTP(AutoHTTPProtocol):  # type: ignore[misc, valid-type]  # uvicorn picks the class at import
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._between_requests():
                if self._head_timer is None:
                    self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expire(self) -> None:
            self._head_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

    return GuardedHTTP
