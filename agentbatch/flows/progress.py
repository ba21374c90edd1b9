"""Live progress of a running batch: a tqdm bar on a terminal, a one-line log record every few
seconds otherwise (CI logs, files), nothing with `--quiet`; and the batch's heartbeat in the store.

Each tick reads what the coordinator holds (admitted samples, environment slots, requests per
engine worker), so the line says where the capacity goes while the batch runs, e.g.

    batch 3: 41/60 samples (1 failed), 9.8 steps/s, ETA 0m12s; active 19/24, env 6/6, w0 8/8, w1 5/8
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

log = logging.getLogger("agentbatch.progress")

MODES = ("bar", "log", "off")
LOG_INTERVAL_S = 10.0  # one progress record per this many seconds in "log" mode
BAR_INTERVAL_S = 1.0
HEARTBEAT_S = 10.0  # the store's batches.heartbeat_at is refreshed this often


def resolve_mode(show_progress: bool | str | None, stream: IO[str] | None = None) -> str:
    """None: a bar on a terminal, log lines otherwise; True: a bar; False: off; or a mode name."""
    if isinstance(show_progress, str):
        if show_progress not in MODES:
            raise ValueError(f"progress mode {show_progress!r}: expected one of {', '.join(MODES)}")
        return show_progress
    if show_progress is None:
        stream = stream if stream is not None else sys.stderr
        return "bar" if getattr(stream, "isatty", lambda: False)() and _columns(stream) > 0 else "log"
    return "bar" if show_progress else "off"


def _columns(stream: IO[str]) -> int:
    """The terminal's width; 0 for a terminal without a size (e.g. a pty under `script`), where a
    bar would draw nothing."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


@dataclass
class Snapshot:
    """What one progress line says."""

    batch_id: int
    total: int
    done: int
    failed: int
    steps_per_s: float | None
    eta_s: float | None
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)  # resource: (in use, capacity)

    def text(self) -> str:
        rate = f"{self.steps_per_s:.1f} steps/s" if self.steps_per_s is not None else "- steps/s"
        eta = _dur(self.eta_s) if self.eta_s is not None else "-"
        use = ", ".join(f"{k} {u}/{c}" for k, (u, c) in self.usage.items())
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (f"batch {self.batch_id}: {self.done}/{self.total} samples{failed}, {rate}, ETA {eta}"
                + (f"; {use}" if use else ""))

    def postfix(self) -> str:
        """The bar's right-hand text (the bar shows done/total itself)."""
        return self.text().split(", ", 1)[1]


def _dur(s: float) -> str:
    m, sec = divmod(int(round(max(s, 0.0))), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


class ProgressReporter:
    """Counts finished samples (`sample_finished`) and, while `run()` is awaited as a task, shows
    progress in the chosen mode and beats the heartbeat."""

    def __init__(self, *, batch_id: int, total: int, done: int = 0, failed: int = 0, mode: str = "log",
                 usage: Callable[[], dict[str, tuple[int, int]]] | None = None,
                 steps_done: Callable[[], int] | None = None,
                 heartbeat: Callable[[], None] | None = None,
                 failed_count: Callable[[], int] | None = None,
                 log_interval_s: float = LOG_INTERVAL_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.batch_id, self.total, self.mode = batch_id, total, mode
        self.done, self.failed = done, failed
        self._done_at_start = done
        self.usage, self.steps_done, self.heartbeat = usage, steps_done, heartbeat
        self.failed_count = failed_count
        self.log_interval_s, self.heartbeat_s = log_interval_s, heartbeat_s
        self.started = time.monotonic()
        self._steps_at_start: int | None = steps_done() if steps_done else None
        self.lines = 0  # progress records logged (log mode)
        self.beats = 0
        self._bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, desc=f"batch {batch_id}", unit="sample",
                             dynamic_ncols=True, file=sys.stderr)

    def sample_finished(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        if self._bar is not None:
            self._bar.update(1)

    def snapshot(self) -> Snapshot:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        steps = self.steps_done() if self.steps_done else None
        if steps is not None and self._steps_at_start is None:
            self._steps_at_start = steps
        rate = (steps - (self._steps_at_start or 0)) / elapsed if steps is not None else None
        finished_here = self.done - self._done_at_start
        eta = (self.total - self.done) * elapsed / finished_here if finished_here else None
        if self.failed_count is not None:
            self.failed = self.failed_count()
        return Snapshot(self.batch_id, self.total, self.done, self.failed, rate, eta,
                        self.usage() if self.usage else {})

    def tick(self) -> Snapshot:
        snap = self.snapshot()
        if self._bar is not None:
            self._bar.set_postfix_str(snap.postfix(), refresh=True)
        elif self.mode == "log":
            log.info("%s", snap.text())
            self.lines += 1
        return snap

    async def beat(self) -> None:
        if self.heartbeat is None:
            return
        try:
            await asyncio.to_thread(self._write_beat, self.heartbeat)
        except Exception as exc:  # noqa: BLE001 - a missed beat must not stop the batch
            log.warning("heartbeat of batch %s not written: %s", self.batch_id, exc)

    def _write_beat(self, heartbeat: Callable[[], None]) -> None:
        # Counted in the thread: a beat written while the reporter is cancelled still counts.
        heartbeat()
        self.beats += 1

    async def run(self) -> None:
        """Tick and beat until cancelled."""
        show_every = BAR_INTERVAL_S if self.mode == "bar" else self.log_interval_s
        next_show = time.monotonic() + (show_every if self.mode == "log" else 0.0)
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_beat:
                await self.beat()
                next_beat = now + self.heartbeat_s
            if self.mode != "off" and now >= next_show:
                self.tick()
                next_show = now + show_every
            await asyncio.sleep(max(0.05, min(next_beat, next_show if self.mode != "off" else next_beat)
                                    - time.monotonic()))

    def close(self) -> None:
        if self._bar is not None:
            with contextlib.suppress(Exception):
                self._bar.set_postfix_str(self.snapshot().postfix(), refresh=False)
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self.done > self._done_at_start:
            log.info("%s", self.snapshot().text())
            self.lines += 1


def coordinator_usage(coordinator: Any) -> Callable[[], dict[str, tuple[int, int]]]:
    """(in use, capacity) per resource of a live Coordinator: admitted samples, environment slots,
    requests in flight per engine worker."""
    limits = coordinator.limits
    names = {"admission": "active", "environment": "env"}

    def usage() -> dict[str, tuple[int, int]]:
        caps = {"admission": limits.effective_active(), "environment": limits.env_slots}
        return {names.get(k, k): (int(u), int(caps.get(k, limits.per_worker_inflight)))
                for k, u in coordinator.in_use().items()}

    return usage


class BatchWatch:
    """What a running batch shows while it runs: the progress display, the store's heartbeat and,
    inside a Prefect flow run, agentbatch's log records on the flow run. Its `update(n)`, `n` and
    `aclose()` stand in for a tqdm bar in the batch flow."""

    def __init__(self, store: Any, batch_id: int, *, total: int, done: int, mode: str,
                 coordinator: Any = None, flow_run_id: Any = None) -> None:
        from sqlalchemy import func, select

        from agentbatch.db.models import Sample, SampleStatus, Step, StepStatus

        def steps_done() -> int:
            q = select(func.count()).select_from(Step).where(Step.batch_id == batch_id,
                                                             Step.status == StepStatus.COMPLETED)
            with store.session() as s:
                return int(s.scalar(q) or 0)

        def failed() -> int:
            q = select(func.count()).select_from(Sample).where(Sample.batch_id == batch_id,
                                                               Sample.status == SampleStatus.FAILED)
            with store.session() as s:
                return int(s.scalar(q) or 0)

        self.reporter = ProgressReporter(
            batch_id=batch_id, total=total, done=done, mode=mode, steps_done=steps_done,
            usage=coordinator_usage(coordinator) if coordinator is not None else None,
            heartbeat=lambda: store.heartbeat(batch_id), failed_count=failed)
        self.forwarder = None
        if flow_run_id is not None:
            from agentbatch.flows.run_logs import FlowRunLogForwarder

            self.forwarder = FlowRunLogForwarder(flow_run_id).__enter__()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, store: Any, batch_id: int, *, total: int, done: int, show_progress: bool | str | None,
              coordinator: Any = None) -> BatchWatch:
        """Start watching (call inside the batch's event loop)."""
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run_id = ctx.flow_run.id if ctx is not None and ctx.flow_run is not None else None
        watch = cls(store, batch_id, total=total, done=done, mode=resolve_mode(show_progress),
                    coordinator=coordinator, flow_run_id=run_id)
        watch._task = asyncio.get_running_loop().create_task(watch._loop())
        return watch

    async def _loop(self) -> None:
        runner = asyncio.ensure_future(self.reporter.run())
        try:
            while True:
                await asyncio.sleep(5.0)
                if self.forwarder is not None:
                    await self.forwarder.flush_to_api()
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    @property
    def n(self) -> int:
        return self.reporter.done

    def update(self, n: int = 1) -> None:
        for _ in range(n):
            self.reporter.sample_finished()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.reporter.close()
        if self.forwarder is not None:
            await self.forwarder.flush_to_api()
            self.forwarder.__exit__()
            self.forwarder = None
