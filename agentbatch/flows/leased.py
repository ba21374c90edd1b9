"""A batch run under sample leases: which samples this process drives, when it stops, how it ends.

- `LeaseKeeper` claims the batch's unfinished samples nobody else drives, renews the leases while the
  samples run, stops a sample whose lease another process took over (it had expired: the renewal
  sees it, or the next write for the sample fails its fencing check with `LeaseLost`) without
  marking it, and releases everything at the end. Two `resume` of one batch thus split its samples; a second one
  that finds every unfinished sample leased to a live process does nothing (exit 2).
- `ClaimWindow`: `run` and `resume` hold a window of unfinished samples (twice the admission limit)
  and claim more, in admission order, as theirs finish; the rest stays free for `join` processes.
- `FailurePolicy` is `--fail-on-error`: a count (stop once more than N samples failed) or a
  fraction of the batch (stop once more than that share failed).
- `final_status` picks completed / completed_with_failures / failed from the samples' statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentbatch.db.leases import ForeignLease, InFlight, LeaseLost, SampleLeases, flag_in_flight
from agentbatch.db.models import BatchStatus, Sample, SampleStatus
from agentbatch.db.store import Store
from agentbatch.protocols.environment import UNSAFE_CALLS
from agentbatch.protocols.in_flight import in_flight_error
from agentbatch.tasks.coordinator import Coordinator

log = logging.getLogger("agentbatch.batch")

BUSY = "busy"  # BatchOutcome.status of a run that found every unfinished sample leased elsewhere


class BatchStopped(Exception):
    """The batch stopped early: more samples failed than `--fail-on-error` tolerates."""


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """How many failed samples a batch tolerates before it stops (None: no limit)."""

    max_count: int | None = None
    max_fraction: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> FailurePolicy:
        """"5" → more than 5 failed samples stop the batch; "0.1" → more than 10 % of them; "0" → the
        first failure. Raises ValueError with the expected form."""
        if text is None or text == "":
            return cls()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--fail-on-error: expected a count (e.g. 5) or a fraction in (0, 1), got {text!r}") \
                from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--fail-on-error: expected a count >= 0 or a fraction in (0, 1), got {text!r}")
        if 0 < value < 1:
            return cls(max_fraction=value)
        if value != int(value):
            raise ValueError(f"--fail-on-error: a count must be a whole number, got {text!r}")
        return cls(max_count=int(value))

    @property
    def active(self) -> bool:
        return self.max_count is not None or self.max_fraction is not None

    def exceeded(self, failed: int, total: int) -> bool:
        if self.max_count is not None:
            return failed > self.max_count
        if self.max_fraction is not None:
            return failed > self.max_fraction * total
        return False

    def describe(self) -> str:
        if self.max_count is not None:
            return f"more than {self.max_count} sample(s) failed"
        return f"more than {self.max_fraction:.0%} of the samples failed"


def final_status(counts: dict[str, int], policy: FailurePolicy, stopped: bool) -> BatchStatus | None:
    """The batch status once this process is done; None while other samples are still unfinished
    (another process drives them and will set it)."""
    total = sum(counts.values())
    failed = counts.get(SampleStatus.FAILED, 0)
    if stopped or (total and failed == total) or policy.exceeded(failed, total):
        return BatchStatus.FAILED
    if counts.get(SampleStatus.PENDING, 0) + counts.get(SampleStatus.RUNNING, 0):
        return None
    return BatchStatus.COMPLETED_WITH_FAILURES if failed else BatchStatus.COMPLETED


def exit_code(status: str, failed: int, policy: FailurePolicy) -> int:
    """0: every sample completed, or the failures stayed within --fail-on-error; 1: otherwise;
    2: nothing run because another process drives the batch."""
    if status == BUSY:
        return 2
    if status == BatchStatus.FAILED:
        return 1
    return 0 if failed == 0 or policy.active else 1


def busy_message(batch_id: int, foreign: list[ForeignLease]) -> str:
    owners = sorted({f.owner for f in foreign})
    return (f"batch {batch_id} is being run by another process ({', '.join(owners)}; {len(foreign)} unfinished "
            "sample(s) leased): nothing left to claim. Wait for it to finish, or run this again once it "
            "stopped (its leases expire 30 s after it dies).")


LEASE_TTL_ENV = "AGENTBATCH_LEASE_TTL_S"


def lease_ttl_s() -> float:
    """How long a sample's lease lasts unrenewed (renewed every third of it): 30 s, or
    AGENTBATCH_LEASE_TTL_S (a shorter one hands a stalled process's samples over sooner)."""
    text = os.environ.get(LEASE_TTL_ENV, "30")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{LEASE_TTL_ENV}: expected a number of seconds > 0, got {text!r}")
    return value


class LeaseKeeper:
    """Claims, renews and releases the leases of one process on one batch while it runs."""

    def __init__(self, store: Store, batch_id: int, policy: FailurePolicy | None = None,
                 ttl_s: float | None = None) -> None:
        self.leases = SampleLeases(store, batch_id, ttl_s=lease_ttl_s() if ttl_s is None else ttl_s)
        self.store = store
        self.batch_id = batch_id
        self.policy = policy or FailurePolicy()
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._lost: set[int] = set()
        self._renewer: asyncio.Task[None] | None = None
        self.total = 0
        # Called on the event loop with the processes driving the batch, at the start and every
        # `owners_poll_s` (e.g. to take this process's share of a batch-wide limit).
        self.on_owners: Callable[[list[str]], None] | None = None
        self.owners_poll_s = 2.0
        self._watcher: asyncio.Task[None] | None = None
        self._failed_before = 0  # failed samples when this process started (--fail-on-error)
        self._failed_here: set[int] = set()  # samples that failed in this process since
        self._stop: str | None = None  # why --fail-on-error stopped the batch

    def claim(self) -> list[Sample]:
        return self.leases.claim()

    def foreign(self) -> list[ForeignLease]:
        return self.leases.foreign()

    async def __aenter__(self) -> LeaseKeeper:
        self.total = len(self.store.samples(self.batch_id))
        if self.policy.active:
            self._failed_before = self.store.status_counts(self.batch_id).get(SampleStatus.FAILED, 0)
        self._renewer = asyncio.create_task(self._renew_loop(), name="agentbatch-lease-renewal")
        if self.on_owners is not None:
            await self._tell_owners()
            self._watcher = asyncio.create_task(self._owners_loop(), name="agentbatch-lease-owners")
        return self

    async def _owners_loop(self) -> None:
        while True:
            await asyncio.sleep(self.owners_poll_s)
            await self._tell_owners()

    async def _tell_owners(self) -> None:
        if self.on_owners is None:
            return
        try:
            owners = await asyncio.to_thread(self.leases.live_owners)
        except Exception as exc:  # noqa: BLE001 - a store hiccup: keep the last share until the next tick
            log.warning("batch %s: reading the processes that drive it failed: %s", self.batch_id, exc)
            return
        self.on_owners(owners)

    async def __aexit__(self, *exc_info: object) -> None:
        for task in (self._renewer, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.to_thread(self.leases.release_all)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.leases.ttl_s / 3)
            before = self.leases.held()
            try:
                still = await asyncio.to_thread(self.leases.renew)
            except Exception as exc:  # noqa: BLE001 - a store hiccup: try again at the next tick
                log.warning("batch %s: renewing sample leases failed: %s", self.batch_id, exc)
                continue
            for sample_id in before - still:
                task = self._tasks.get(sample_id)
                if task is not None and not task.done():
                    log.warning("batch %s: sample %s is now driven by another process; stopping it here",
                                self.batch_id, sample_id)
                    self._lost.add(sample_id)
                    task.cancel()

    def settle_in_flight(self, todo: list[Sample], policy: str, ask: bool = False) -> list[Sample]:
        """Steps of external-state environments that were executing when a process died: flagged
        "may have executed" in the store. Such a step runs again only where that is safe: policy
        "retry" and every call of the step takes an idempotency key or is annotated read-only or
        idempotent (`unsafe_calls` recorded when the step began). `ask`: the workload reconciles
        (`protocols/in_flight.py`): under "retry" the sample runs, and its environment is asked first
        whether the step ran (`tasks/reconcile.py`). Otherwise its sample stops with an error naming
        the step, the calls and how to go on (`retry --in-flight-checked`).
        Returns the samples still to run."""
        fences = self.fences(todo)
        flagged = flag_in_flight(self.store, fences)
        if not flagged:
            return todo
        calls = _unsafe_calls(self.store, self.batch_id, flagged)
        unsafe = {f.sample_id for f in flagged if calls.get(f.sample_id) != []}
        stopped = {f.sample_id: f.step_index for f in flagged
                   if policy == "fail" or (f.sample_id in unsafe and not ask)}
        log.warning("batch %s: %d step(s) of environments with external state may have executed before the "
                    "last process died (policy %s): %d run again (safe to repeat), %d asked to the environment "
                    "first, %d stopped for a check", self.batch_id, len(flagged), policy,
                    len(flagged) - len(unsafe | set(stopped)), len(unsafe - set(stopped)), len(stopped))
        tasks = {s.id: s.task_id for s in todo}
        for sample_id, index in stopped.items():
            error = in_flight_error(self.batch_id, sample_id, tasks.get(sample_id, "?"), index, calls.get(sample_id),
                                    policy)
            if not self.store.finish_sample(sample_id, score=None, result=None, error=error, token=fences[sample_id]):
                log.warning("batch %s: sample %s is now driven by another process; leaving it to it",
                            self.batch_id, sample_id)
        return [s for s in todo if s.id not in stopped]

    def fences(self, samples: list[Sample]) -> dict[int, int]:
        """Sample id -> the lease token this process claimed it with, for the samples it holds."""
        tokens = self.leases.tokens
        return {s.id: tokens[s.id] for s in samples if s.id in tokens}

    async def run(self, sample_id: int, coro: Coroutine[Any, Any, Any]) -> None:
        """Drive one sample; then check --fail-on-error. A sample whose lease was lost ends quietly."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks[sample_id] = task
        try:
            await coro
        except LeaseLost:  # taken over while this process was stalled: the sample's outcome is the taker's
            log.warning("batch %s: sample %s is now driven by another process; letting it go here (nothing of "
                        "it written)", self.batch_id, sample_id)
            self._lost.add(sample_id)
            return
        except asyncio.CancelledError:
            if sample_id in self._lost:
                return
            raise
        finally:
            self._tasks.pop(sample_id, None)
        if self.policy.active and self._stop is None:  # failures of other processes count too
            failed = (await asyncio.to_thread(self.store.status_counts, self.batch_id)).get(SampleStatus.FAILED, 0)
            if self.policy.exceeded(failed, self.total):
                self._stop = self._stopped_message(failed)
        if self._stop is not None:
            raise BatchStopped(self._stop)

    def sample_ended(self, coordinator: Coordinator, sample_id: int, status: SampleStatus) -> None:
        """A sample of this process ended, its admission slot not yet freed: once failures exceed
        --fail-on-error no sample is admitted any more (admission stops before the slot is freed),
        so the stop comes at that failure, not at a later one."""
        if status != SampleStatus.FAILED or not self.policy.active:
            return
        self._failed_here.add(sample_id)
        failed = self._failed_before + len(self._failed_here)
        if self._stop is None and self.policy.exceeded(failed, self.total):
            self._stop = self._stopped_message(failed)
            coordinator.stop_admission()

    def _stopped_message(self, failed: int) -> str:
        return f"stopped: {failed} of {self.total} samples failed (--fail-on-error: {self.policy.describe()})"


def window_size(max_active_samples: int) -> int:
    """How many unfinished samples `run` / `resume` hold at a time: twice the admission limit keeps
    the engines busy while the rest of the batch stays claimable by other processes."""
    return max(16, 2 * max_active_samples)


class ClaimWindow:
    """The samples a `run` / `resume` process has yet to claim, in admission order (`order`, set once
    the admission plan is known), taken a few at a time as its own samples finish."""

    def __init__(self, leases: SampleLeases, size: int) -> None:
        self.leases = leases
        self.size = size
        self.order: list[int] = []

    def take(self, n: int) -> list[Sample]:
        """Claim up to `n` more samples, the next in `order` that nobody holds (blocking: from a
        thread); the ones held elsewhere are skipped for good (their process finishes them, or `join`
        takes them over when their leases expire)."""
        got: list[Sample] = []
        while self.order and len(got) < n:
            ids, self.order = self.order[: n - len(got)], self.order[n - len(got):]
            rank = {sid: k for k, sid in enumerate(ids)}
            mine = self.leases.claim(len(ids), among=ids, new_only=True)
            got += sorted((s for s in mine if s.id in rank), key=lambda s: rank[s.id])
        return got


def _unsafe_calls(store: Store, batch_id: int, flagged: list[InFlight]) -> dict[int, list[str] | None]:
    """Sample id -> the calls its flagged step recorded as unsafe to repeat (None: not recorded)."""
    wanted = {(f.sample_id, f.step_index) for f in flagged}
    out: dict[int, list[str] | None] = {f.sample_id: None for f in flagged}
    for step in store.steps(batch_id):
        if (step.sample_id, step.index) in wanted and isinstance(step.request, dict) and UNSAFE_CALLS in step.request:
            out[step.sample_id] = list(step.request[UNSAFE_CALLS])
    return out


@dataclass(frozen=True, slots=True)
class IdleRun:
    """What a run that had nothing to claim reports."""

    status: str
    samples: int
    failed: int
    message: str = ""


def idle_run(keeper: LeaseKeeper) -> IdleRun:
    """Nothing to claim: another process drives the rest (busy), or the batch is finished. A finished
    batch keeps its status, finished_at and flow run; one left `running` by a process that died
    after its last sample gets its final status now."""
    store, batch_id = keeper.store, keeper.batch_id
    counts = store.status_counts(batch_id)
    total, failed = sum(counts.values()), counts.get(SampleStatus.FAILED, 0)
    foreign = keeper.foreign()
    if foreign:
        return IdleRun(BUSY, total, failed, busy_message(batch_id, foreign))
    batch = store.get_batch(batch_id)
    status = batch.status if batch is not None else BatchStatus.PENDING
    if status in (BatchStatus.PENDING, BatchStatus.RUNNING):
        status = final_status(counts, keeper.policy, stopped=False) or status
        store.finish_batch(batch_id, BatchStatus(status))
    return IdleRun(str(status), total, failed, f"batch {batch_id} has no unfinished sample ({status})")


def finish(keeper: LeaseKeeper, stopped: str | None) -> str:
    """Write the batch's final status unless other processes still drive some of its samples."""
    status = final_status(keeper.store.status_counts(keeper.batch_id), keeper.policy, stopped is not None)
    if status is None:
        return BatchStatus.RUNNING
    keeper.store.finish_batch(keeper.batch_id, status, error=stopped)
    return status
