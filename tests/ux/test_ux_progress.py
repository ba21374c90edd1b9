"""The progress display: a bar on a real terminal, log records otherwise, nothing when off; the
heartbeat it keeps in the store; throttled log forwarding."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import termios
import time

import pytest

from agentbatch.flows.progress import ProgressReporter, Snapshot, resolve_mode
from agentbatch.flows.run_logs import FlowRunLogForwarder, LogWindow


def test_mode_follows_the_stream():
    master, slave = os.openpty()  # a real terminal device
    try:
        with os.fdopen(slave, "w") as tty:
            assert resolve_mode(None, tty) == "log"  # a new pty has no size: a bar would draw nothing
            fcntl.ioctl(tty.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            assert resolve_mode(None, tty) == "bar"
    finally:
        os.close(master)
    r, w = os.pipe()
    with os.fdopen(r) as _, os.fdopen(w, "w") as pipe:
        assert resolve_mode(None, pipe) == "log"
    assert resolve_mode(False) == "off" and resolve_mode(True) == "bar" and resolve_mode("log") == "log"
    with pytest.raises(ValueError, match="expected one of bar, log, off"):
        resolve_mode("loud")


def test_snapshot_text():
    snap = Snapshot(batch_id=3, total=60, done=41, failed=1, steps_per_s=9.84, eta_s=72.0,
                    usage={"active": (19, 24), "env": (6, 6), "w0": (8, 8)})
    assert snap.text() == ("batch 3: 41/60 samples (1 failed), 9.8 steps/s, ETA 1m12s; "
                           "active 19/24, env 6/6, w0 8/8")
    assert snap.postfix().startswith("9.8 steps/s")


def run_reporter(mode: str, caplog) -> ProgressReporter:
    steps = iter(range(0, 10_000, 5))
    beats: list[float] = []
    rep = ProgressReporter(batch_id=7, total=4, mode=mode, steps_done=lambda: next(steps),
                           usage=lambda: {"env": (1, 2)}, heartbeat=lambda: beats.append(time.time()),
                           log_interval_s=0.05, heartbeat_s=0.05)

    async def go() -> None:
        task = asyncio.ensure_future(rep.run())
        for _ in range(3):
            await asyncio.sleep(0.12)
            rep.sample_finished()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rep.close()

    with caplog.at_level(logging.INFO, logger="agentbatch.progress"):
        asyncio.run(go())
    assert rep.beats == len(beats) >= 2  # the heartbeat runs in every mode
    return rep


def test_log_mode_writes_lines(caplog):
    rep = run_reporter("log", caplog)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "agentbatch.progress" and r.getMessage().startswith("batch 7: ")]
    assert rep.lines == len(lines) >= 2, [r.getMessage() for r in caplog.records]
    assert lines[-1].startswith("batch 7: 3/4 samples, ") and lines[-1].endswith("env 1/2")
    assert "ETA -" in lines[0] and "ETA -" not in lines[-1]  # an ETA once samples finish
    assert " 0.0 steps/s" not in lines[-1]  # steps counted since the reporter started


def test_off_mode_is_silent(caplog):
    rep = run_reporter("off", caplog)
    assert rep.lines == 0 and not [r for r in caplog.records if r.name == "agentbatch.progress"]


def test_store_heartbeat(sqlite_url):
    from agentbatch.db.store import Store

    store = Store(sqlite_url)
    bid = store.create_batch("b", {}, [("t", {})])
    assert store.get_batch(bid).heartbeat_at is None
    store.mark_batch_running(bid)
    first = store.get_batch(bid).heartbeat_at
    time.sleep(0.01)
    store.heartbeat(bid)
    assert store.get_batch(bid).heartbeat_at > first
    store.close()


def test_log_forwarding_is_throttled():
    fwd = FlowRunLogForwarder("00000000-0000-0000-0000-000000000000", window=LogWindow(max_per_window=3))
    with fwd:
        log = logging.getLogger("agentbatch.test")
        log.setLevel(logging.INFO)
        for i in range(10):
            log.info("record %d", i)
        logging.getLogger("other").warning("not agentbatch")
        logging.getLogger("agentbatch.test").debug("below INFO")
    assert [e["message"] for e in fwd.buffer] == ["record 0", "record 1", "record 2"]
    assert fwd.window.dropped == 7
    log.info("after the handler was removed")
    assert len(fwd.buffer) == 3
