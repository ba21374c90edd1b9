"""Live ETA of a running batch, from the chain lengths seen so far.

remaining steps: for each unfinished sample, expected chain length - steps done (at least 1). The
expected length of a task is its mean over earlier batches' completed samples of the same task id
where the store has them, else the mean over this batch's completed samples, else unknown (then
the sample's steps so far + 1, a lower bound).
remaining time = max(remaining steps / the batch's step rate so far,
                     longest remaining chain x mean seconds per step of one sample),
the first term for throughput, the second because one chain's steps cannot overlap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from agentbatch.dashboards.analytics import DONE_STATES
from agentbatch.dashboards.frames import BatchData, history_steps_per_task, load_batch
from agentbatch.db.leases import dead_drivers
from agentbatch.db.store import Store


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


def _elapsed(sm: pd.DataFrame, now: float, finished: bool) -> float:
    t0 = sm["admitted_at"].min()
    if pd.isna(t0):
        return 0.0
    if finished and len(sm):
        last = float(sm["finished_at"].max()) if sm["finished_at"].notna().any() else now
        return last - float(t0)
    return max(0.0, now - float(t0))


def _expected_remaining(store: Store, data: BatchData, eta: Eta) -> pd.Series:
    """Steps left per unfinished sample (at least 1), and where the chain lengths came from (eta.basis)."""
    sm = data.samples
    left = sm[~sm["status"].isin(DONE_STATES)]
    hist = history_steps_per_task(store, [str(t) for t in left["task_id"]], data.batch_id)
    eta.tasks_with_history = int(left["task_id"].isin(hist.index).sum())
    completed = sm[sm["status"] == "completed"]
    batch_mean = float(completed["steps_done"].mean()) if len(completed) else math.nan
    expected = left["task_id"].map(hist).astype("float64")
    from_batch = expected.isna()
    expected = expected.fillna(batch_mean)
    unknown = expected.isna()
    expected = expected.where(~unknown, left["steps_done"] + 1)  # lower bound when nothing is known
    sources = []
    if eta.tasks_with_history:
        sources.append(f"earlier batches ({eta.tasks_with_history} samples)")
    if (from_batch & ~unknown).any():
        sources.append(f"this batch's {len(completed)} completed samples")
    if unknown.any():
        sources.append(f"a lower bound for {int(unknown.sum())} samples (no finished chain seen)")
    eta.basis = "; ".join(sources)
    return np.maximum(expected - left["steps_done"], 1.0)


def _chain_step_s(sm: pd.DataFrame, completed_steps: pd.DataFrame) -> float | None:
    """Seconds per step along one chain: each sample's time to its last completed step / its steps."""
    last_fin = completed_steps.groupby("sample_id")["finished_at"].max()
    per = sm.set_index("id").join(last_fin.rename("last_fin"), how="inner")
    per = per[per["steps_done"] > 0]
    per_step = ((per["last_fin"] - per["admitted_at"]) / per["steps_done"]).clip(lower=0)
    return float(per_step.mean()) if len(per_step) else None


def _cut_short(eta: Eta) -> None:
    """A crashed batch's attempts left `running` run no more and are not done: a tool call among them may
    have taken effect (a gateway's /mcp call, an external environment's step), so say so."""
    if eta.steps_running:
        eta.steps_cut_short, eta.steps_running = eta.steps_running, 0
        eta.notes.append(f"{eta.steps_cut_short} step(s) were in flight when the process stopped: not done, and "
                         "a tool call among them may have taken effect (check the tool's state before repeating it)")


def estimate_eta(store: Store, batch_id: int, now: float | None = None) -> Eta:
    """Progress and ETA of a batch; raises frames.UnknownBatch for an unknown id."""
    data = load_batch(store, batch_id)
    now = time.time() if now is None else now
    sm, st = data.samples, data.steps
    done_mask = sm["status"].isin(DONE_STATES)
    completed_steps = st[st["status"] == "completed"]
    eta = Eta(batch_id=data.batch_id, name=data.name, status=data.status, total=len(sm), done=int(done_mask.sum()),
              counts={str(k): int(v) for k, v in sm["status"].value_counts().items()},
              steps_done=len(completed_steps),
              steps_retried=int(st["status"].isin(["failed", "abandoned"]).sum()),
              steps_running=int((st["status"] == "running").sum()),
              elapsed_s=_elapsed(sm, now, bool(done_mask.all())), remaining_steps=None,
              step_rate=None, step_s_per_sample=None, remaining_s=None, basis="nothing yet",
              heartbeat_age_s=None if data.heartbeat_at is None else now - data.heartbeat_at)
    if done_mask.all():
        eta.remaining_steps, eta.remaining_s, eta.basis = 0.0, 0.0, "finished"
        return eta
    dead = dead_drivers(store, batch_id, now) if data.status == "running" else []
    if dead or crashed(data.status, data.heartbeat_at, now):
        eta.status = "crashed"
        eta.basis = "no ETA: the process running the batch stopped"
        why = (f"the process running the batch ({', '.join(dead)}) no longer exists on this host" if dead
               else f"no heartbeat for {_dur(eta.heartbeat_age_s or 0.0)}: the process running the batch is gone")
        eta.notes.append(f"{why}; continue with: agentbatch resume {batch_id}")
        _cut_short(eta)
        return eta
    remaining = _expected_remaining(store, data, eta)
    eta.remaining_steps = float(remaining.sum())
    if eta.steps_done == 0 or eta.elapsed_s <= 0:
        eta.notes.append("no completed step yet: no rate to extrapolate")
        return eta
    eta.step_rate = eta.steps_done / eta.elapsed_s
    eta.step_s_per_sample = _chain_step_s(sm, completed_steps)
    throughput_s = eta.remaining_steps / eta.step_rate
    chain_s = float(remaining.max()) * (eta.step_s_per_sample or 0.0)
    eta.remaining_s = max(throughput_s, chain_s)
    return eta
