"""The samples stopped for a check (on a step that may have executed before a crash), for `status`
and the report's summary. No pandas: `status` imports this."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentbatch.protocols.environment import IN_FLIGHT_STOPPED


def stopped_in_flight(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """The samples stopped on a step that may have executed, each with what to check; `samples`: rows
    with id, task_id and error (ORM rows, DataFrame tuples, `Store.samples_with_error_prefix`)."""
    return [{"sample": int(s.id), "task": str(s.task_id), "check": s.error.removeprefix(IN_FLIGHT_STOPPED)}
            for s in samples if isinstance(s.error, str) and s.error.startswith(IN_FLIGHT_STOPPED)]
