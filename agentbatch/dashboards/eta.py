"""Live ETA of a running batch, from the chain lengths seen so far.

remaining steps: for each unfinished sample, expected chain length - steps done (at least 1). The
expected length of a task is its mean over earlier batches' completed samples of the same task id
where the store has them, else the mean over this batch's completed samples, else unknown (then
the sample's steps so far + 1, a lower bound).
remaining time = max(remaining steps / the batch's step rate so far,
                     longest remaining chain x mean seconds per step of one sample),
the first term for throughput, the second because one chain's steps cannot overlap.

Every figure comes from SQL aggregates (`Store.sample_progress`, `step_counts`, ...), never from
one row per sample or step, and nothing here imports pandas: `agentbatch status` answers in well
under a second on a batch of 10,000 samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import make_url

from agentbatch.db.leases import dead_drivers
from agentbatch.db.models import DONE_SAMPLES, SampleStatus, StepStatus
from agentbatch.db.store import RemainingSteps, SampleProgress, Store, UnknownBatch


@dataclass
class Eta:
    batch_id: int
    name: str
    status: str
    total: int
    done: int  # completed + failed samples
    counts: dict[str, int]
    steps_done: int  # completed step attempts
    steps_retried: int  # failed or abandoned attempts
    steps_running: int
    elapsed_s: float
    remaining_steps: float | None
    step_rate: float | None  # completed steps per second so far
    step_s_per_sample: float | None  # mean seconds per step along one chain
    remaining_s: float | None
    basis: str  # where the chain lengths came from
    tasks_with_history: int = 0
    notes: list[str] = field(default_factory=list)
    heartbeat_age_s: float | None = None  # seconds since the running process last beat
    steps_cut_short: int = 0  # of a crashed batch: attempts its dead process left `running` (not done)

    def to_text(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        lines = [f"batch {self.batch_id} ({self.name}): {self.status}",
                 f"  samples   {self.done}/{self.total} done ({pct:.1f} %): {counts or 'none'}",
                 f"  steps     {self.steps_done} completed, "
                 + (f"{self.steps_cut_short} cut short by the crash, " if self.steps_cut_short else
                    f"{self.steps_running} running, ") + f"{self.steps_retried} retried attempts",
                 f"  elapsed   {_dur(self.elapsed_s)}"]
        if self.step_rate:
            lines.append(f"  rate      {self.step_rate:.2f} steps/s; {self.step_s_per_sample or 0:.2f} s per step "
                         "along a chain")
        if self.remaining_s is None:
            lines.append(f"  ETA       unknown ({self.basis})")
        elif self.remaining_s == 0:
            lines.append("  ETA       done")
        else:
            at = time.strftime("%H:%M:%S", time.localtime(time.time() + self.remaining_s))
            lines.append(f"  ETA       {_dur(self.remaining_s)} (about {at}); {self.remaining_steps:.0f} steps "
                         f"left; chain lengths from {self.basis}")
        lines.extend(f"  note      {n}" for n in self.notes)
        return "\n".join(lines)


def _dur(s: float) -> str:
    s = max(0.0, s)
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{s:.1f}s")


STALE_AFTER_S = 60.0  # six missed beats (flows/progress.py beats every 10 s): the process is gone


def crashed(status: str, heartbeat_at: float | None, now: float) -> bool:
    """A batch marked running whose process stopped beating (killed, machine gone)."""
    return status == "running" and heartbeat_at is not None and now - heartbeat_at > STALE_AFTER_S


def _elapsed(progress: SampleProgress, now: float, finished: bool) -> float:
    t0 = progress.first_admitted_at
    if t0 is None:
        return 0.0
    if finished and progress.total:
        last = progress.last_finished_at
        return (now if last is None else last) - t0
    return max(0.0, now - t0)


def _expected_remaining(store: Store, batch_id: int, progress: SampleProgress, eta: Eta) -> RemainingSteps:
    """Steps left over the unfinished samples, and where the chain lengths came from (eta.basis)."""
    batch_mean = progress.completed_mean_steps
    left = store.remaining_steps(batch_id, batch_mean)
    eta.tasks_with_history = left.with_history
    from_batch = left.samples - left.with_history if batch_mean is not None else 0
    unknown = left.samples - left.with_history - from_batch
    sources = []
    if eta.tasks_with_history:
        sources.append(f"earlier batches ({eta.tasks_with_history} samples)")
    if from_batch:
        sources.append(f"this batch's {progress.counts.get(SampleStatus.COMPLETED, 0)} completed samples")
    if unknown:
        sources.append(f"a lower bound for {unknown} samples (no finished chain seen)")
    eta.basis = "; ".join(sources)
    return left


def _cut_short(eta: Eta) -> None:
    """A crashed batch's attempts left `running` run no more and are not done: a tool call among them may
    have taken effect (a gateway's /mcp call, an external environment's step), so say so."""
    if eta.steps_running:
        eta.steps_cut_short, eta.steps_running = eta.steps_running, 0
        eta.notes.append(f"{eta.steps_cut_short} step(s) were in flight when the process stopped: not done, and "
                         "a tool call among them may have taken effect (check the tool's state before repeating it)")


def _crash_notes(eta: Eta, batch_id: int, dead: list[str]) -> None:
    eta.status = "crashed"
    eta.basis = "no ETA: the process running the batch stopped"
    why = (f"the process running the batch ({', '.join(dead)}) no longer exists on this host" if dead
           else f"no heartbeat for {_dur(eta.heartbeat_age_s or 0.0)}: the process running the batch is gone")
    eta.notes.append(f"{why}; continue with: agentbatch resume {batch_id}")
    _cut_short(eta)


def estimate_eta(store: Store, batch_id: int, now: float | None = None) -> Eta:
    """Progress and ETA of a batch; raises UnknownBatch for an unknown id."""
    batch = store.get_batch(batch_id)
    if batch is None:
        raise UnknownBatch(batch_id, make_url(store.url).render_as_string(hide_password=True))  # as given
    now = time.time() if now is None else now
    progress = store.sample_progress(batch_id)
    steps = store.step_counts(batch_id)
    done = sum(progress.counts.get(s, 0) for s in DONE_SAMPLES)
    finished = done == progress.total
    eta = Eta(batch_id=batch.id, name=batch.name, status=batch.status, total=progress.total, done=done,
              counts=dict(progress.counts), steps_done=steps.get(StepStatus.COMPLETED, 0),
              steps_retried=steps.get(StepStatus.FAILED, 0) + steps.get(StepStatus.ABANDONED, 0),
              steps_running=steps.get(StepStatus.RUNNING, 0),
              elapsed_s=_elapsed(progress, now, finished), remaining_steps=None,
              step_rate=None, step_s_per_sample=None, remaining_s=None, basis="nothing yet",
              heartbeat_age_s=None if batch.heartbeat_at is None else now - batch.heartbeat_at)
    if finished:
        eta.remaining_steps, eta.remaining_s, eta.basis = 0.0, 0.0, "finished"
        return eta
    dead = dead_drivers(store, batch_id, now) if batch.status == "running" else []
    if dead or crashed(batch.status, batch.heartbeat_at, now):
        _crash_notes(eta, batch_id, dead)
        return eta
    remaining = _expected_remaining(store, batch_id, progress, eta)
    eta.remaining_steps = remaining.steps
    if eta.steps_done == 0 or eta.elapsed_s <= 0:
        eta.notes.append("no completed step yet: no rate to extrapolate")
        return eta
    eta.step_rate = eta.steps_done / eta.elapsed_s
    eta.step_s_per_sample = store.chain_step_s(batch_id)
    throughput_s = eta.remaining_steps / eta.step_rate
    chain_s = remaining.longest * (eta.step_s_per_sample or 0.0)
    eta.remaining_s = max(throughput_s, chain_s)
    return eta
