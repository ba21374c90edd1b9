"""Re-planning a live batch while it runs (`scheduling.replan`).

When `scheduling.policy: auto` chose the batch's policy by simulation (flows/policy_choice.py), the
run looks again at checkpoints every `replan.every` of the chosen candidate's predicted makespan
(wall seconds: virtual seconds x the engines' time scale). At each, the batch's past is replayed in
virtual time from the steps the store has recorded and every candidate's remainder is simulated
with the unrevealed futures drawn from the earlier runs (sim/replan_live.py); the batch switches
when a candidate is predicted no slower than staying in any earlier run and faster by
`replan.margin` on average, the rule of virtual time (sim/replan.py).

A switch changes, on the event loop between two driver calls: the coordinator's policies
(`SchedulingCore.swap`: nothing granted is taken back, no waiting step is lost; a coupled candidate
runs as its decoupled equivalent), the chain-length priors of the samples running and to come, the
order the claim window claims the rest in, and the batch's stored config (`scheduling.policy` and
`scheduling.choice.switches`), so a resume or a `join` that starts later runs what was switched to.
The simulations run in a process of their own (spawned once per batch), off the event loop and
its interpreter lock; a switch is made when its look returns, and a checkpoint that passed while a
look ran is skipped (its state is gone). A checkpoint where another process drives samples of the
batch too (`join`) does not switch: the simulation knows this process's engines and slots only,
and the processes would have to agree on one switch. A gateway served by one process re-plans the
same way (`replanning`, from flows/commands/gateway.py): its clock starts with its first sample, and
the samples its harness has not sent yet are replayed as the first earlier batch's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.models import DONE_SAMPLES
from agentbatch.db.store import Store
from agentbatch.db.trace_io import RecordReader
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.leased import ClaimWindow
from agentbatch.flows.policy_choice import apply_candidate
from agentbatch.protocols.secrets import to_stored
from agentbatch.scheduling.types import SampleProgress
from agentbatch.sim.portfolio import candidate_config
from agentbatch.sim.replan import Revealed, Switch, policy_swap
from agentbatch.sim.replan_live import LivePlan, Look, LookProcess
from agentbatch.tasks.coordinator import Coordinator
from agentbatch.traces.schema import Trace

log = logging.getLogger("agentbatch.replan")


@dataclass(eq=False)
class LiveTarget:
    """What a switch changes in the running batch. `priors` and `progress` are the run's own (the
    priors the next samples start with; the running samples' progress by sample id). A gateway has
    neither (its samples take their priors from the history as they arrive) nor a claim window."""

    store: Store
    batch_id: int
    config: BatchConfig
    coordinator: Coordinator
    drivers: Callable[[], int]  # how many processes drive the batch's samples now
    window: ClaimWindow | None
    priors: dict[str, float]
    progress: dict[int, SampleProgress]
    samples: dict[int, tuple[str, int]]  # sample id -> (task id, index) of every sample of the batch
    workers: list[str]
    summary: dict[str, Any]  # the run's `policy` summary: the switches are added to it
    stored: Callable[[BatchConfig], dict[str, Any]] = field(default=lambda c: to_stored(c.model_dump(mode="json")))

    def save(self) -> None:
        """The config as switched, into the batch's row (`stored`: as the batch records a config)."""
        self.store.set_batch_config(self.batch_id, self.stored(self.config))


@dataclass(eq=False)
class LiveReplanner:
    """Looks at every checkpoint until the batch's samples have ended (`run`, cancelled with the batch)."""

    plan: LivePlan
    time_scale: float  # wall seconds per virtual second
    target: LiveTarget
    switches: list[Switch] = field(default_factory=list)
    looks: int = 0
    simulations: int = 0
    cpu_s: float = 0.0
    _process: LookProcess | None = None
    _reader: RecordReader | None = None  # the batch's record, read anew at each checkpoint
    started: Callable[[], bool] | None = None  # the batch's clock starts once true (a gateway's first sample)

    async def run(self) -> None:
        while self.started is not None and not self.started():
            await asyncio.sleep(0.05)
        start = time.time()
        self._process = LookProcess(self.plan)
        interval = self.plan.every_s * self.time_scale  # wall seconds between checkpoints
        k = 0
        while True:
            k = max(k + 1, int((time.time() - start) / interval) + 1)  # the next checkpoint still ahead
            await asyncio.sleep(max(0.0, start + k * interval - time.time()))
            try:
                seen = await asyncio.to_thread(self._look, k)
            except BrokenProcessPool:
                log.warning("batch %s: the re-planning process ended; the batch keeps its policy", self.target.batch_id)
                return
            except Exception:  # noqa: BLE001 - a failed look leaves the batch on its policy
                log.exception("batch %s: re-planning at checkpoint %d failed; the batch keeps its policy",
                              self.target.batch_id, k)
                continue
            if seen is None:
                return
            if seen.switch is not None:
                await self._switch(seen.switch)

    def _look(self, k: int) -> Look | None:
        """The k-th checkpoint (in a thread); None once every sample has ended."""
        t = self.target
        self._reader = self._reader or RecordReader(t.store, t.batch_id)
        recorded = self._reader.read()
        revealed = revealed_steps(recorded)
        if len(revealed.ended) == len(recorded.samples) >= (self.plan.expected or 0):
            return None
        drivers = t.drivers()
        if drivers > 1:
            log.info("batch %s: checkpoint %d: %d processes drive the batch; not re-planned", t.batch_id, k, drivers)
            return Look(None, 0, 0.0)
        assert self._process is not None
        seen = self._process.look(recorded, revealed, k, self.switches)
        self.looks += 1
        self.simulations += seen.simulations
        self.cpu_s += seen.cpu_s
        if seen.switch is None:
            log.info("batch %s: checkpoint %d (%.1f s virtual): staying with %r (%d simulations, %.2f s CPU)",
                     t.batch_id, k, k * self.plan.every_s, self.incumbent, seen.simulations, seen.cpu_s)
        return seen

    def close(self) -> None:
        """Stop looking; what re-planning did, in the run's summary and the stored choice (`replan`)."""
        if self._process is not None:
            self._process.close()
        t = self.target
        t.summary["replan"] = {"every_s": round(self.plan.every_s, 3), "checkpoints": self.looks,
                               "switches": len(self.switches), "simulations": self.simulations,
                               "cpu_s": round(self.cpu_s, 3)}  # fmt: skip
        choice = {**(t.config.scheduling.choice or {}), "replan": t.summary["replan"]}
        t.config = t.config.model_copy(update={"scheduling": t.config.scheduling.model_copy(update={"choice": choice})})
        t.save()
        log.info("batch %s: re-planning looked at %d checkpoint(s): %d switch(es), %d simulation(s), %.2f s CPU",
                 t.batch_id, self.looks, len(self.switches), self.simulations, self.cpu_s)

    @property
    def incumbent(self) -> str:
        return self.switches[-1].new if self.switches else self.plan.first.name

    async def _switch(self, sw: Switch) -> None:
        """Swap the candidate in (module docstring) and record it with the batch."""
        t = self.target
        c = next(c for c in self.plan.pool if c.name == sw.new)
        member = self.plan.members[0]
        samples = self.plan.expected or len(t.samples)
        cfg = candidate_config(c, self.plan.base, samples=samples, n_ref=self.plan.n_ref,
                               priors=member.priors, context_priors=member.context_priors)  # fmt: skip
        kv = self.plan.base.engine_profile().kv_capacity_tokens * self.plan.base.workers
        swap = policy_swap(c, cfg, t.workers, coupled_now=t.coordinator.core.limits.coupled, kv_tokens=kv)
        t.priors.clear()
        t.priors.update(cfg.priors or {})
        for p in t.progress.values():
            p.prior_chain_steps = t.priors.get(p.task_id)
        t.coordinator.swap(swap)
        if t.window is not None and swap.admission_order is not None:
            t.window.order = _reordered(t.window.order, t.samples, t.priors, swap.admission_order)
        self.switches.append(sw)
        gain = sum(n / s for n, s in zip(sw.new_predicted, sw.old_predicted, strict=True)) / len(sw.old_predicted)
        # at_s: virtual (engine) seconds from the start; at_wall_s: the same on the wall clock
        record = {"at_s": round(sw.at_s, 3), "at_wall_s": round(sw.at_s * self.time_scale, 3),
                  "checkpoint": round(sw.at_s / self.plan.every_s), "from": sw.old, "to": sw.new,
                  "predicted_ratio": round(gain, 4)}  # fmt: skip
        t.summary.setdefault("switches", []).append(record)
        log.info("batch %s: re-planned at %.1f s virtual: %r -> %r (remainder predicted x%.3f of staying)",
                 t.batch_id, sw.at_s, sw.old, sw.new, gain)
        t.config = _switched_config(t.config, c, samples, t.summary, t.priors)
        await asyncio.to_thread(t.save)


@contextlib.asynccontextmanager
async def replanning(plan: LivePlan, time_scale: float, target: LiveTarget,
                     started: Callable[[], bool] | None = None) -> AsyncIterator[LiveReplanner]:
    """Re-plan while the body runs (`LiveReplanner`); what it did goes to the summary and the stored
    choice when the body ends."""
    replanner = LiveReplanner(plan, time_scale, target, started=started)
    task = asyncio.create_task(replanner.run(), name="agentbatch-replan")
    try:
        yield replanner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        replanner.close()


def revealed_steps(recorded: Trace) -> Revealed:
    """Per trace index the steps recorded in order from the first, and the samples that ended."""
    steps: dict[int, int] = {}
    ended: set[int] = set()
    for i, s in enumerate(recorded.samples):
        n = 0
        while n < len(s.steps) and s.steps[n].index == n:
            n += 1
        steps[i] = n
        if s.status in DONE_SAMPLES:
            ended.add(i)
    return Revealed(steps, frozenset(ended))


def _reordered(order: list[int], samples: dict[int, tuple[str, int]], priors: dict[str, float],
               admission_order: Callable[[list[SampleProgress]], list[SampleProgress]]) -> list[int]:
    """The samples not yet claimed in the new admission order."""
    progress = [SampleProgress(sample_id=sid, task_id=samples[sid][0], arrival_seq=samples[sid][1],
                               prior_chain_steps=priors.get(samples[sid][0])) for sid in order]  # fmt: skip
    return [p.sample_id for p in admission_order(progress)]


def _switched_config(config: BatchConfig, c: Any, samples: int, summary: dict[str, Any],
                     priors: dict[str, float]) -> BatchConfig:
    """The stored config after a switch: the candidate's scheduling with the priors it runs with (a
    baseline none), the choice with its switches."""
    switched = apply_candidate(config, c, samples)
    choice = {**(config.scheduling.choice or {}), "switches": list(summary.get("switches", []))}
    update: dict[str, Any] = {"choice": choice}
    if c.uses_priors:
        update["priors"] = dict(priors)
    return switched.model_copy(update={"scheduling": switched.scheduling.model_copy(update=update)})
