"""Helpers shared by the test folders (importable as `testkit`: pytest puts tests/ on sys.path).

Each one is written once here; a test folder's own helpers live in `<folder>/<folder>_helpers.py`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from unittest import mock

T = TypeVar("T")

# The CLI as a subprocess runs it (the same interpreter and environment as the tests).
CLI = [sys.executable, "-m", "agentbatch.flows.cli"]


def run_cli_here(args: list[str], db_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`agentbatch ARGS` in this process, for a command whose process is not the point (nothing kills
    it, nothing runs beside it): what `subprocess.run` of `CLI` returns, without ~3 s of CPU to start a process.
    Output goes to files (children it starts, such as stdio MCP servers, write to their descriptors);
    its log lines go to the captured stderr, as the CLI's own logging setup would send them. `db_url`:
    the store as AGENTBATCH_DB_URL (None: the environment's). Prefect's settings are this process's:
    a test that changes Prefect's environment for the command runs it in a subprocess."""
    from agentbatch.flows.cli import LOG_FORMAT, main

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        handler = logging.StreamHandler(err)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            with mock.patch.dict(os.environ, {} if db_url is None else {"AGENTBATCH_DB_URL": db_url}), \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        finally:
            root.removeHandler(handler)
            root.setLevel(old_level)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, code, out.read(), err.read())


def max_overlap(intervals: Iterable[tuple[float, float]], after: float | None = None) -> int:
    """Most intervals open at once; an end at the same instant as a start closes first.

    With `after`, only the part of each interval later than `after` counts (a steady state after a
    ramp-up)."""
    spans = [(s, e) for s, e in intervals if after is None or e > after]
    if after is not None:
        spans = [(max(s, after), e) for s, e in spans]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listens(port: int, timeout_s: float = 1.0) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:`port` (a server that has no health page)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def answers(url: str) -> bool:
    """True when a GET of `url` answers 200 (a server's health page), False while nothing listens."""
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(check: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05,
               alive: Callable[[], bool] | None = None) -> T:
    """Poll `check` until it returns something truthy and return that; fail naming `what` after
    `timeout_s`, or at once when `alive` (e.g. "the subprocess still runs") turns false.

    For conditions no event announces (a file another process writes, rows in a database); the
    poll interval is short, so the test goes on as soon as the condition holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if alive is not None and not alive():
            raise AssertionError(f"gave up waiting for {what}: the process it needs has ended")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(interval_s)


def commit_writes(store: Any, writes: Iterable[Any]) -> None:
    """Commit step attempts and sample updates (`db/step_records.py` writes) through the one writer, in
    order, each awaited as the runner awaits its completions."""
    import asyncio

    from agentbatch.db.writer import StepWriter

    async def main() -> None:
        async with StepWriter(store) as writer:
            for write in writes:
                await writer.commit(write)

    asyncio.run(main())
