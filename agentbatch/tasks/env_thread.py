"""Blocking environments run on a private event loop in a worker thread.

An environment that declares `blocking = True` does synchronous work (CPU, blocking I/O, `time.sleep`)
inside its coroutines; awaited on the batch's event loop it would freeze every other sample. Wrapped
here, each of its calls runs on an event loop of its own, in a thread of its own (one per active
sample: the environment's state and resources stay on one loop), and the batch's loop only awaits
the result. The step timeout still applies: when it fires the step fails at once and the call is
cancelled at its next await; Python cannot stop a thread inside a blocking call, so the thread
finishes that call in the background and `close` stops waiting for it after `close_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import EnvReset, EnvResult, TaskSpec, is_blocking

log = logging.getLogger(__name__)
T = TypeVar("T")


class ThreadedEnvironment:
    """Runs every call of a blocking environment on its own loop thread."""

    blocking = False  # the wrapper itself never blocks the caller's loop

    def __init__(self, env: Any, close_timeout_s: float = 30.0) -> None:
        self.env = env
        self.close_timeout_s = close_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"agentbatch-env-{type(env).__name__}")
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # restore_mode, workload-specific attributes
        own = getattr(self.env, name)
        if name == "reconcile":  # an optional coroutine method (protocols/in_flight.py): on the env's loop
            return lambda assistant: self._call(own(assistant))
        return own

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        # Cancelling the awaiting task (step timeout) cancels the call on the environment's loop.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def reset(self, task: TaskSpec) -> EnvReset:
        return await self._call(self.env.reset(task))

    async def step(self, assistant: Message) -> EnvResult:
        return await self._call(self.env.step(assistant))

    async def restore(self, pairs: list[Any]) -> None:
        await self._call(self.env.restore(pairs))

    async def score(self) -> dict[str, Any]:
        return await self._call(self.env.score())

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await self._call(self.env.close())
        except TimeoutError:
            log.warning("%s: close still blocked after %.0f s; leaving its thread behind",
                        type(self.env).__name__, self.close_timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            with contextlib.suppress(RuntimeError):
                await asyncio.to_thread(self._thread.join, 1.0)


def off_the_loop(env: Any, step_timeout_s: float) -> Any:
    """The environment itself, or a ThreadedEnvironment when it declares blocking code."""
    return ThreadedEnvironment(env, close_timeout_s=max(step_timeout_s, 1.0)) if is_blocking(env) else env
