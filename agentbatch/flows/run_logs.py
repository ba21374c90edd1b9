"""agentbatch's own log records, forwarded to the batch's Prefect flow run (its Logs tab).

Prefect's own log shipping is off in a CLI run (it costs a few ms per task run); this handler sends
only the `agentbatch` loggers' records at INFO and above, at most `max_per_window` per window (the
rest are counted and reported in one record), through the Prefect client in batches.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class LogWindow:
    max_per_window: int = 30
    window_s: float = 60.0
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    dropped: int = 0

    def admit(self, now: float) -> bool:
        if now - self.started >= self.window_s:
            self.started, self.sent = now, 0
        if self.sent >= self.max_per_window:
            self.dropped += 1
            return False
        self.sent += 1
        return True


class FlowRunLogForwarder(logging.Handler):
    """Buffers the `agentbatch` records of one flow run; `flush_to_api()` sends them."""

    def __init__(self, flow_run_id: Any, *, level: int = logging.INFO, window: LogWindow | None = None,
                 logger_name: str = "agentbatch") -> None:
        super().__init__(level)
        self.flow_run_id = flow_run_id
        self.window = window or LogWindow()
        self.logger_name = logger_name
        self.buffer: list[dict[str, Any]] = []
        self.forwarded = 0
        self._reported_drops = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("agentbatch.flows.run_logs"):
            return  # never forward our own complaints (a failing API would loop)
        if not self.window.admit(time.monotonic()):
            return
        self.buffer.append(self._entry(record.name, record.levelno, self.format(record), record.created))

    def _entry(self, name: str, level: int, message: str, created: float) -> dict[str, Any]:
        return {"name": name, "level": level, "message": message, "flow_run_id": self.flow_run_id,
                "timestamp": datetime.fromtimestamp(created, UTC)}

    def __enter__(self) -> FlowRunLogForwarder:
        self.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger(self.logger_name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.logger_name).removeHandler(self)

    async def flush_to_api(self) -> int:
        """Send what is buffered (and a note on throttled records); returns how many were sent."""
        drops = self.window.dropped - self._reported_drops
        if drops:
            self.buffer.append(self._entry(self.logger_name, logging.INFO,
                                           f"({drops} agentbatch log records not forwarded: throttled)", time.time()))
            self._reported_drops = self.window.dropped
        if not self.buffer:
            return 0
        batch, self.buffer = self.buffer, []
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import LogCreate

        try:
            async with get_client() as client:
                await client.create_logs([LogCreate(**e) for e in batch])
        except Exception as exc:  # noqa: BLE001 - the Logs tab must not break the batch
            log.debug("cannot forward %d log records to the flow run: %s", len(batch), exc)
            return 0
        self.forwarded += len(batch)
        return len(batch)
