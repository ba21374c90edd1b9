"""The simulated engine in real time: a TimingModel that runs one EngineModel per worker.

An asyncio task drives the model: it runs one iteration, sleeps its duration (times `time_scale`),
resolves the futures of the requests that finished, and goes on while there is work. Requests that
arrive during an iteration join the next one, as in a real engine. While the engine has work its
steps follow one another in model time: a sleep that wakes late (the event loop's timer rounds to
whole milliseconds, a loaded host wakes later still) is made up by the next steps, which run without
sleeping until the model is back on the wall clock, as a GPU's back-to-back steps would not have
waited for it. Only a lag beyond MAX_BEHIND_S (the process starved) or an idle engine moves the
model's clock to the wall clock.

Config: {"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 1.0, "policy": "priority"}
plus any profile field as an override (e.g. "num_kv_blocks": 2000). time_scale < 1 runs faster
than real time (0.01: a 5 s request takes 50 ms); returned durations are in wall seconds.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Sequence
from typing import Any

from agentbatch.engines.timing import Timing
from agentbatch.sim.model import EngineModel, RequestStats, SimRequest
from agentbatch.sim.profiles import EngineProfile, get_profile

MAX_AHEAD_S = 5e-4  # wall seconds the model may run ahead of real time instead of sleeping
MAX_BEHIND_S = 0.05  # wall seconds the model may lag real time and still catch up (timer overshoot)


class SimulatedTiming:
    def __init__(
        self,
        profile: str | EngineProfile = "llama3-8b-h100",
        time_scale: float = 1.0,
        policy: str = "priority",
        name: str = "sim-0",
        **overrides: Any,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.profile = get_profile(profile, **overrides)
        self.model = EngineModel(self.profile, name=name, policy=policy)
        self.name = name
        self.time_scale = float(time_scale)
        self._t0 = time.monotonic()
        self._futures: dict[str, asyncio.Future[RequestStats]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._seq = 0
        self._clock: float | None = None  # model time the next step starts at, while the engine is busy

    def now(self) -> float:
        """Model time: wall seconds since start divided by time_scale."""
        return (time.monotonic() - self._t0) / self.time_scale

    def arrival_time(self) -> float:
        """Model time a request arriving now is stamped with: now, or the start of the next step
        while the busy engine is catching up (it joins that step, so it cannot have come later)."""
        now = self.now()
        return now if self._clock is None else min(now, self._clock)

    # --- TimingModel -----------------------------------------------------------------------------
    async def run(
        self, *, request_id: str, sample_id: int, prompt: Sequence[int], output_tokens: int, priority: int | None
    ) -> Timing:
        stats = await self.submit(
            SimRequest(request_id, sample_id, prompt, output_tokens, priority=int(priority or 0))
        )
        s = self.time_scale
        return Timing(
            queue_s=stats.queue_s * s,
            prefill_s=stats.prefill_s * s,
            decode_s=stats.decode_s * s,
            cached_prompt_tokens=stats.cached_prompt_tokens,
            recomputed_tokens=stats.recomputed_tokens,
        )

    async def aclose(self) -> None:
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            try:
                await self._driver
            except (asyncio.CancelledError, RuntimeError):
                pass
        self._driver = None
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()
        self._futures.clear()

    # --- driving the model -----------------------------------------------------------------------
    async def submit(self, req: SimRequest) -> RequestStats:
        """Add a request and wait until the model finishes it; stats are in model seconds."""
        self._bind_loop()
        assert self._loop is not None and self._wake is not None
        if req.request_id in self._futures:  # a retry of a request that is still in the engine
            self._seq += 1
            req.request_id = f"{req.request_id}#{self._seq}"
        if not isinstance(req.prompt, array):
            # 8 bytes a token in the engine's per-sample memo instead of a list of Python ints
            req.prompt = array("q", req.prompt)
        fut: asyncio.Future[RequestStats] = self._loop.create_future()
        self._futures[req.request_id] = fut
        self.model.add_request(req, self.arrival_time())
        self._wake.set()
        try:
            return await fut
        except asyncio.CancelledError:
            self._futures.pop(req.request_id, None)
            self.model.abort_request(req.request_id)
            raise

    def metrics(self) -> dict[str, float]:
        """vLLM-style counters of this worker (for routers and the store's worker record)."""
        return self.model.metrics()

    def holds_prefix(self, sample_id: int) -> int:
        return self.model.holds_prefix(sample_id)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._driver is not None and not self._driver.done():
            return
        if self._loop is not loop and any(not f.done() for f in self._futures.values()):
            raise RuntimeError("SimulatedTiming is serving requests on another event loop")
        self._loop = loop
        self._wake = asyncio.Event()
        self._driver = loop.create_task(self._drive(), name=f"sim-engine-{self.name}")

    async def _drive(self) -> None:
        assert self._wake is not None
        model = self.model
        clock = self.now()  # model time at which the last step ended (a new driver starts idle)
        while True:
            if not model.has_work():
                self._clock = None
                self._wake.clear()
                await self._wake.wait()
                clock = max(clock, self.now())  # it sat idle: the next step starts on the wall clock
                continue
            # Busy: the next step starts when the last one ended, unless the loop is so late that the
            # process was starved (then the engine waited as well).
            start = max(clock, self.now() - MAX_BEHIND_S / self.time_scale)
            result = model.run_iteration(start)
            clock = self._clock = start + result.duration
            delay = (clock - self.now()) * self.time_scale
            # Sleeping less than the loop's own overhead would stretch fast-forwarded runs
            # (time_scale << 1): let the model run up to MAX_AHEAD_S ahead of the wall clock instead.
            await asyncio.sleep(delay if delay > MAX_AHEAD_S else 0)
            for stats in result.finished:
                fut = self._futures.pop(stats.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(stats)
