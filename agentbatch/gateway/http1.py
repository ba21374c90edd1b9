"""The gateway's own HTTP/1.1 client connections, for its hottest outgoing requests (chat requests to
the engine workers, direct tool calls to MCP upstreams).

A `Connection` is one kept-alive connection carrying one exchange at a time: the request's bytes are
written as they are, the answer is parsed by httptools (uvicorn's C parser), its body read whole or
piece by piece as it arrives (SSE streams). A `Pool` keeps the idle connections to one origin and
drops those idle for `IDLE_S`, before the server would close them under a request (uvicorn: 5 s).
This costs about a third of the CPU of an aiohttp session per request: no request and response
objects, no header multidicts, no stream reader.

Errors: a connection that cannot be made raises `OSError` from `Pool.connection`; a connection cut
or an answer that is not HTTP raises one of `ERRORS` from `send`/`read`/`pieces`; a wait longer than
the exchange's `timeout_s` for the next bytes raises `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0  # an idle connection is dropped before the server would close it (uvicorn: 5 s)
BUFFER_LIMIT = 2**20  # body bytes received but not read yet: reading pauses above this
ERRORS = (OSError, TimeoutError, httptools.HttpParserError)  # the peer unreachable, gone, late or not HTTP


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: one exchange at a time (`send`, then `read` or `pieces`)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = ""
        self.reusable = True  # neither side said it closes, no error
        self.idle_since = 0.0
        self._pieces: deque[bytes] = deque()  # body received, not read yet
        self._buffered = 0
        self._paused = False  # reading paused: more than BUFFER_LIMIT unread
        self._head = False  # the answer's status and headers are in
        self._complete = False  # ... and its whole body
        self._framed = False  # its end is in the bytes (Content-Length or chunked), not the close
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol and httptools callbacks --------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._head and not self._complete and not self._framed and exc is None:
            self._complete = True  # a body that ends with the connection
            self._wake()
        elif not self._complete:
            self._fail(exc or ConnectionResetError("the server closed the connection"))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)
        self._buffered += len(body)
        if self._buffered > BUFFER_LIMIT and not self._paused and self.transport is not None:
            self._paused = True  # the reader is slower than the server: let TCP hold it back
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.reusable = self.reusable and self.parser.should_keep_alive()
        self._complete = True
        self._wake()

    # --- the exchange ------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """The last answer was read to its end (the connection can carry another exchange)."""
        return self._complete and not self._pieces and self._error is None

    async def send(self, *data: bytes, timeout_s: float | None = None) -> None:
        """Write a request (its head and body, as they are); return once the answer's head is in
        (`status`, `content_type`)."""
        assert self.transport is not None
        self.status, self.content_type = 0, ""
        self._head = self._complete = self._framed = False
        self._pieces.clear()
        self._buffered = 0
        if self._error is not None or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self.transport.writelines(data)
        while not self._head:
            await self._wait(timeout_s)

    async def pieces(self, timeout_s: float | None = None) -> AsyncIterator[bytes]:
        """The answer's body as it arrives: all that came since the last piece, at once (a read with
        many chunks of a chunked body in it is one piece)."""
        while True:
            if self._pieces:
                pieces = self._pieces
                piece = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
                pieces.clear()
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield piece
            elif self._complete:
                return
            else:
                await self._wait(timeout_s)

    async def read(self, timeout_s: float | None = None) -> bytes:
        """The answer's whole body."""
        if self._complete:  # usually in with the head
            parts: list[bytes] | deque[bytes] = self._pieces
        else:
            parts = [piece async for piece in self.pieces(timeout_s)]
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._pieces.clear()
        self._buffered = 0
        return body

    async def _wait(self, timeout_s: float | None) -> None:
        """Until the parser has more (or the connection failed: its error raised)."""
        if self._error is not None:
            raise self._error
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            if timeout_s is None:
                await waiter
            else:
                async with asyncio.timeout(timeout_s):
                    await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self.close()
        self._wake()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class Pool:
    """The kept-alive connections to one origin (`url`'s scheme, host and port); the most recently
    used is taken first."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.host = parts.netloc.rsplit("@", 1)[-1]  # the Host header
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")  # the request target
        self.idle: list[Connection] = []

    def head(self, headers: Mapping[str, str], target: str | None = None) -> bytes:
        """A POST's head up to its Content-Length: the request line (to `target`, else the pool's URL),
        Host and `headers`. Made once where it does not change (per worker, per owner, per tool)."""
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return f"POST {target or self.target} HTTP/1.1\r\nhost: {self.host}\r\n{lines}".encode("latin-1")

    async def post(self, head: bytes, body: bytes, timeout_s: float | None = None) -> Connection:
        """Send `head` (from `head()`) and `body` over a connection; returns it once the answer's head is
        in (read its body, then `release` it). `timeout_s` bounds the connecting and each wait for the
        answer's next bytes. Raises OSError (no connection) or one of ERRORS (cut, late, not HTTP)."""
        async with asyncio.timeout(timeout_s):
            conn = await self.connection()
        try:
            await conn.send(head, b"content-length: %d\r\n\r\n" % len(body), body, timeout_s=timeout_s)
        except BaseException:
            self.release(conn)  # closed: the exchange was cut off
            raise
        return conn

    async def connection(self) -> Connection:
        """An idle connection, or a new one (OSError: none could be made)."""
        loop = asyncio.get_running_loop()
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable and loop.time() - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        _, conn = await loop.create_connection(Connection, *self.address, ssl=self.tls)
        return conn

    def release(self, conn: Connection) -> None:
        """Back to the idle ones when its answer was read to its end and it may be kept; closed otherwise
        (an exchange cut off, an answer left unread)."""
        if conn.finished and conn.reusable:
            conn.idle_since = asyncio.get_running_loop().time()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close the idle connections (those in use close when released)."""
        while self.idle:
            self.idle.pop().close()
