"""The samples a gateway has seen: their progress, admission and end.

A sample is created (a `samples` row) on its first request and takes an admission slot from the
coordinator before its first step runs. It ends on an explicit finish, on a final answer (an
assistant message without tool calls, when `end_on_answer`), or when it has been idle for
`idle_timeout_s`; ending gives the admission slot back. A sample that sends another request after it
ended runs again (the same row, its step indices continuing) and waits for admission like a new one.

Harnesses rarely say that a sample is done (a react agent's last turn is a `submit` tool call, and
nobody calls `/finish`), so a sample must not hold its admission slot while nothing happens: when
samples wait for admission, an admitted sample without a step in flight for longer than its own
step gaps suggest (`yield_factor` times its longest gap so far, at least `yield_min_s`) yields its
slot to the first of them. It does not end: its next request takes a slot again, ahead of the
samples waiting, and the workers keep its prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from agentbatch.db import gateway_records as records
from agentbatch.db.step_records import SampleRef
from agentbatch.db.store import chain_length_means
from agentbatch.db.writer import StepWriter
from agentbatch.gateway.identity import ConversationTree
from agentbatch.scheduling.types import SampleProgress
from agentbatch.tasks.coordinator import Coordinator


@dataclass(slots=True)
class SampleEnd:
    """How a sample ends: why, and what the harness reported with an explicit finish."""

    reason: str
    score: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass(eq=False)
class GatewaySample:
    key: str
    row: SampleRef  # its `samples` row (the id is set once written)
    progress: SampleProgress
    next_index: int = 0
    admitted: bool = False
    in_flight: int = 0
    last_active: float = 0.0
    seen_messages: int = 0  # messages of the last inference request (later ones record only what is new)
    last_tools: list[Any] | None = None  # the last request's tools (recorded again when they change)
    pending_end: SampleEnd | None = None  # an end that waits for the steps in flight
    by_conversation: bool = False  # named by the conversation tree (no explicit id)
    yielded: bool = False  # gave its admission slot to a waiting sample without ending
    idle_since: float | None = None  # when its last step ended (no step in flight since)
    longest_gap: float = 0.0  # its longest time from the end of a step to the start of the next
    ends: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def take_index(self) -> int:
        index, self.next_index = self.next_index, self.next_index + 1
        return index


def _create(session: Session, batch_id: int, sample: GatewaySample) -> None:
    """Write the sample's row; look up its mean chain length in earlier batches (the key as task
    id), which later priorities use (its first request goes out without it). In the writer's
    transaction: no connection of its own per sample."""
    records.add_sample(session, sample.row, batch_id, sample.key, {"gateway": True})
    sample.progress.prior_chain_steps = chain_length_means(session, [sample.key], batch_id).get(sample.key)


class SampleRegistry:
    def __init__(self, coordinator: Coordinator, recorder: StepWriter, batch_id: int, *,
                 end_on_answer: bool = True, yield_min_s: float = 1.0, yield_factor: float = 4.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.coordinator = coordinator
        self.yield_min_s = yield_min_s
        self.yield_factor = yield_factor
        self.yields = 0  # admission slots given to waiting samples by idle ones
        self.on_end: list[Callable[[GatewaySample], None]] = []  # called as each sample ends
        self.recorder = recorder
        self.batch_id = batch_id
        self.end_on_answer = end_on_answer
        self.clock = clock
        self.samples: dict[str, GatewaySample] = {}
        self.conversations = ConversationTree()  # the samples without an explicit id
        self._arrivals = itertools.count()
        self.ended = 0  # sample ends so far (a sample that ran again counts again)

    @property
    def active(self) -> int:
        return sum(1 for s in self.samples.values() if s.admitted)

    def get(self, key: str) -> GatewaySample:
        """The sample of `key`, created on first sight (its row is written in the background)."""
        sample = self.samples.get(key)
        if sample is None:
            seq = next(self._arrivals)
            # The coordinator keys samples by an id of this process; the store row id comes later.
            sample = GatewaySample(key=key, row=SampleRef(), last_active=self.clock(),
                                   progress=SampleProgress(sample_id=seq, task_id=key, arrival_seq=seq))
            self.samples[key] = sample
            self.recorder.submit(_create, self.batch_id, sample)
        return sample

    async def enter(self, key: str | None, messages: list[Any] | None = None) -> GatewaySample:
        """Before a step: the sample, admitted (waiting for an admission slot if it has none). No
        `key`: the sample whose conversation `messages` extends, or a new one (`ConversationTree`);
        its request then ends with `leave_request`."""
        by_conversation = key is None
        if key is None:
            key = self.conversations.claim(messages or [])
        sample = self.get(key)
        sample.by_conversation |= by_conversation
        sample.in_flight += 1
        sample.last_active = self.clock()
        if sample.idle_since is not None:
            sample.longest_gap = max(sample.longest_gap, sample.last_active - sample.idle_since)
            sample.idle_since = None
        try:
            if not sample.admitted:
                async with sample.lock:
                    if not sample.admitted:
                        await self.coordinator.admit(sample.progress, first=sample.yielded)
                        sample.admitted, sample.yielded = True, False
                        sample.pending_end = None
                        self.recorder.submit(records.admit_sample_at, sample.row, self.clock())
        except BaseException:
            sample.in_flight -= 1
            if by_conversation:
                self.conversations.done(key, answered=False)
            raise
        return sample

    def leave_request(self, sample: GatewaySample, *, completed: bool, answered: bool = False) -> None:
        """After an inference request; `completed`: the worker answered it."""
        if sample.by_conversation:
            self.conversations.done(sample.key, answered=completed)
        self.leave(sample, answered=answered)

    def leave(self, sample: GatewaySample, *, answered: bool = False) -> None:
        """After a step; `answered`: it was a final answer (no tool calls)."""
        sample.in_flight -= 1
        sample.last_active = self.clock()
        if not sample.in_flight:
            sample.idle_since = sample.last_active
        if answered and self.end_on_answer and sample.pending_end is None:
            sample.pending_end = SampleEnd("answer")
        if sample.pending_end is not None and sample.in_flight == 0:
            self._end(sample, sample.pending_end)

    def finish(self, key: str, end: SampleEnd) -> bool:
        """An explicit end; False when the key is unknown. With steps in flight it waits for them."""
        sample = self.samples.get(key)
        if sample is None:
            return False
        if sample.in_flight:
            sample.pending_end = end
        else:
            self._end(sample, end)
        return True

    def yield_after(self, sample: GatewaySample, idle_timeout_s: float) -> float:
        """How long `sample` may sit without a step in flight before it yields its admission slot."""
        return min(idle_timeout_s, max(self.yield_min_s, self.yield_factor * sample.longest_gap))

    def yield_idle(self, idle_timeout_s: float) -> int:
        """Admitted samples idle past `yield_after` give their slots to the samples waiting for
        admission (the longest idle first, one per waiting sample); returns how many yielded."""
        waiting = self.coordinator.waiting_admission
        if not waiting:
            return 0
        now = self.clock()
        idle = sorted((s for s in self.samples.values() if s.admitted and not s.in_flight
                       and s.pending_end is None and now - s.last_active >= self.yield_after(s, idle_timeout_s)),
                      key=lambda s: s.last_active)[:waiting]
        for sample in idle:
            sample.admitted, sample.yielded = False, True
            self.yields += 1
            self.coordinator.yield_admission(sample.progress)
        return len(idle)

    def end_idle(self, idle_timeout_s: float) -> int:
        """End the samples (admitted or yielded) without a step for `idle_timeout_s`; returns how many."""
        now = self.clock()
        idle = [s for s in self.samples.values()
                if (s.admitted or s.yielded) and not s.in_flight and now - s.last_active >= idle_timeout_s]
        for sample in idle:
            self._end(sample, SampleEnd("idle"))
        return len(idle)

    def end_all(self, reason: str) -> None:
        """End every sample still open (the batch ends); one never admitted ends failed."""
        for sample in self.samples.values():
            if sample.admitted or sample.yielded:
                self._end(sample, sample.pending_end or SampleEnd(reason))
            elif sample.ends == 0:
                self._end(sample, SampleEnd(reason, error=f"never admitted: {reason}"))

    def _end(self, sample: GatewaySample, end: SampleEnd) -> None:
        sample.pending_end = None
        if sample.admitted or sample.yielded:
            sample.admitted = sample.yielded = False
            sample.ends += 1
            self.ended += 1
            self.coordinator.finish(sample.progress)
        for hook in self.on_end:
            hook(sample)
        result = {"ended": end.reason, **(end.result or {})}
        self.recorder.submit(records.end_sample, sample.row, self.clock(), score=end.score, result=result,
                             error=end.error)
