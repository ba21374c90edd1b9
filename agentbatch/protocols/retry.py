"""The retry rule of every step: which failures are retried, how many times, how far apart.

One `RetryPolicy` serves the runner's inference steps, environment steps, environment starts and
scoring (`tasks/`) and both gateways (`gateway/`). What a failure means is said by its type, which
engines and environments (built-in or plugins) raise:

- `EngineFailure` (protocols/engine.py): the engine could not answer (connection, HTTP 5xx, a
  malformed answer). An inference request changes nothing outside the engine: retried.
- `EnvironmentFailure` (protocols/environment.py): an infrastructure failure of the environment (a
  dead sandbox, a server that does not answer), not a tool error. Retried by the runner, whose
  environments rebuild their own state (`restore_mode`) or say by raising it that a retry is safe.
- `EnvironmentUnreachable` (an `EnvironmentFailure`): the call never reached the environment
  (connection refused, server not running). Retrying it cannot repeat a side effect.
- `TimeoutError` and `ConnectionError` are taken as engine or environment failures.

A call whose side effects land outside agentbatch and that may have run (`Effects.EXTERNAL`: a tool
call the gateway forwarded upstream) is retried only when the failure proves it never arrived, or
when the tool consents (`Call.idempotent`: the hook that tool annotations fill). A call without side
effects at all (`Effects.NONE`: scoring) is retried after any exception.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agentbatch.protocols.engine import EngineFailure
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable

T = TypeVar("T")
log = logging.getLogger("agentbatch.retry")

RETRYABLE: tuple[type[BaseException], ...] = (EngineFailure, EnvironmentFailure, TimeoutError, ConnectionError)
NEVER_ARRIVED: tuple[type[BaseException], ...] = (EnvironmentUnreachable, ConnectionRefusedError)


class StepFailed(Exception):
    """A call failed for good (its retries ran out, or the failure is not retried): its sample fails
    (runner) or the harness gets an error (gateways)."""


class Effects(enum.StrEnum):
    NONE = "none"  # changes nothing (scoring): any exception may be retried
    CONTAINED = "contained"  # inference, or an environment that rebuilds or owns its state: retryable failures
    EXTERNAL = "external"  # may have changed state elsewhere: only a call that never arrived, or an idempotent tool


@dataclass(frozen=True, slots=True)
class Call:
    """What is tried, as far as the retry rule needs to know."""

    kind: str  # "inference" or "environment": whose retry count applies
    what: str  # for messages: "inference step 4", "scoring", ...
    effects: Effects = Effects.CONTAINED
    idempotent: bool = False  # EXTERNAL only: the tool declares that running it twice is harmless


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    environment: int = 2  # retries of an environment call (step, start, scoring) after a retryable failure
    inference: int = 2  # retries of an inference request after a retryable failure
    backoff_s: float = 0.5  # first retry delay; doubles each retry

    def retries(self, kind: str) -> int:
        return self.inference if kind == "inference" else self.environment

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (0-based)."""
        return self.backoff_s * 2.0**retry

    @staticmethod
    def retryable(exc: BaseException, call: Call) -> bool:
        """The one rule: may `call` be tried again after failing with `exc`?"""
        if not isinstance(exc, Exception):  # cancellation, exit: never
            return False
        if call.effects == Effects.NONE:
            return True
        if not isinstance(exc, RETRYABLE):
            return False
        if call.effects == Effects.EXTERNAL:
            return isinstance(exc, NEVER_ARRIVED) or call.idempotent
        return True

    async def run(self, call: Call, attempt: Callable[[int], Awaitable[T]]) -> T:
        """`await attempt(n)` for n = 1, 2, ... until one returns; a retryable failure waits the
        backoff and tries again. Raises StepFailed (caused by the last failure) when it gives up;
        cancellation passes through."""
        retries = self.retries(call.kind)
        n = 0
        while True:
            n += 1
            try:
                return await attempt(n)
            except Exception as exc:
                if not self.retryable(exc, call):
                    raise StepFailed(f"{call.what}: {exc.__class__.__name__}: {exc}") from exc
                if n > retries:
                    raise StepFailed(f"{call.what} failed after {n} attempt(s): "
                                     f"{exc.__class__.__name__}: {exc}") from exc
                log.info("%s: %s: %s; retry %d of %d", call.what, exc.__class__.__name__, exc, n, retries)
            await asyncio.sleep(self.delay(n - 1))
