"""Makespan analytics of one batch, computed with pandas from its stored samples and steps.

Definitions (docs/dashboards.md has the long form):
- t0 = first sample admitted; makespan = last sample finished - t0.
- Step attempts: only `completed` attempts count as work done; `failed`/`abandoned` attempts are
  retries (their time is the `retries` phase).
- Service time of a step: inference = finished - started - engine_queue_s; environment =
  finished - started. A sample's chain at zero contention = sum of its completed steps' service.
- Phases are sample-seconds summed over samples; per sample they add up to its latency
  (finished - admitted); `orchestration` is what the recorded steps do not explain (gaps between
  consecutive steps, agent-loop and HTTP overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from agentbatch.dashboards.capacity import Capacity, batch_capacity
from agentbatch.dashboards.frames import BatchData
from agentbatch.dashboards.timeline import occupancy, time_average
from agentbatch.db.models import DONE_SAMPLES
from agentbatch.scheduling.lower_bound import LowerBound, makespan_lower_bound

PHASES = ("inference_queue", "prefill", "decode", "environment_queue", "environment_exec", "retries",
          "orchestration")
WAIT_PHASES = ("admission", "inference_queue", "environment_queue", "retries", "orchestration")
DEAD_GAP_S = 10.0  # this long with no step of any sample queued, running or retrying: the batch was stopped


@dataclass(frozen=True)
class CriticalSample:
    """A sample among the last to finish, with where its time went."""

    sample_id: int
    task_id: str
    finished_s: float  # relative to t0
    latency_s: float
    steps: int
    chain_s: float  # zero-contention chain
    waits: dict[str, float]  # admission + WAIT_PHASES seconds
    waited_on: str  # the largest wait


def _nz(x: pd.Series) -> pd.Series:
    return x.fillna(0.0)


class BatchAnalysis:
    """All figures of one batch; each computed once on first use."""

    def __init__(self, data: BatchData) -> None:
        self.data = data
        self.samples = data.samples
        self.steps = data.steps

    # --- frames --------------------------------------------------------------------------------
    @cached_property
    def capacity(self) -> Capacity:
        return batch_capacity(self.data)

    @cached_property
    def completed_steps(self) -> pd.DataFrame:
        st = self.steps[self.steps["status"] == "completed"].copy()
        wall = st["finished_at"] - st["started_at"]
        inf = st["kind"] == "inference"
        st["queue_s"] = (st["started_at"] - st["enqueued_at"]).clip(lower=0)
        st["service_s"] = np.where(inf, (wall - _nz(st["engine_queue_s"])).clip(lower=0), wall.clip(lower=0))
        # Engines that do not report the prefill/decode split: count the whole service as decode.
        split_known = st["prefill_s"].notna() | st["decode_s"].notna()
        st["prefill_part"] = np.where(inf, _nz(st["prefill_s"]), 0.0)
        st["decode_part"] = np.where(inf, np.where(split_known, _nz(st["decode_s"]), st["service_s"]), 0.0)
        return st

    @cached_property
    def t0(self) -> float | None:
        v = self.samples["admitted_at"].min()
        return None if pd.isna(v) else float(v)

    @cached_property
    def t_end(self) -> float | None:
        """Last sample finished (or, while running, the last recorded event)."""
        candidates = [self.samples["finished_at"].max(), self.steps["finished_at"].max(),
                      self.steps["started_at"].max()]
        vals = [float(v) for v in candidates if not pd.isna(v)]
        if self.is_finished:
            vals = [float(self.samples["finished_at"].max())]
        return max(vals) if vals else None

    @cached_property
    def is_finished(self) -> bool:
        return bool(len(self.samples)) and bool(self.samples["status"].isin(DONE_SAMPLES).all())

    @cached_property
    def makespan_s(self) -> float | None:
        if self.t0 is None or self.t_end is None:
            return None
        return self.t_end - self.t0

    # --- per sample ----------------------------------------------------------------------------
    @cached_property
    def per_sample(self) -> pd.DataFrame:
        """One row per sample: latency, chain, steps and the phase split (seconds)."""
        sm = self.samples.set_index("id")
        out = pd.DataFrame(index=sm.index)
        out["task_id"] = sm["task_id"]
        out["status"] = sm["status"]
        out["score"] = sm["score"]
        end = sm["finished_at"].where(sm["finished_at"].notna(), self.t_end if self.t_end is not None else np.nan)
        out["admitted_at"] = sm["admitted_at"]
        out["finished_at"] = sm["finished_at"]
        out["latency_s"] = end - sm["admitted_at"]
        out["admission_s"] = sm["admitted_at"] - self.t0 if self.t0 is not None else np.nan
        st = self.completed_steps
        inf = st[st["kind"] == "inference"]
        env = st[st["kind"] == "environment"]
        g_inf = inf.groupby("sample_id")
        g_env = env.groupby("sample_id")
        zero = pd.Series(0.0, index=out.index)
        out["steps"] = st.groupby("sample_id").size().reindex(out.index, fill_value=0)
        out["chain_s"] = st.groupby("sample_id")["service_s"].sum().reindex(out.index, fill_value=0.0)
        out["inference_queue"] = (g_inf["queue_s"].sum() + g_inf["engine_queue_s"].sum(min_count=0)
                                  ).reindex(out.index, fill_value=0.0)
        out["prefill"] = g_inf["prefill_part"].sum().reindex(out.index, fill_value=0.0)
        out["decode"] = g_inf["decode_part"].sum().reindex(out.index, fill_value=0.0)
        out["environment_queue"] = g_env["queue_s"].sum().reindex(out.index, fill_value=0.0)
        out["environment_exec"] = g_env["service_s"].sum().reindex(out.index, fill_value=0.0)
        retry = self.steps[self.steps["status"] != "completed"]
        retry_end = retry["finished_at"].fillna(retry["started_at"])
        retry_s = (retry_end - retry["enqueued_at"]).clip(lower=0).groupby(retry["sample_id"]).sum()
        out["retries"] = retry_s.reindex(out.index, fill_value=0.0) if not retry.empty else zero
        explained = out[["inference_queue", "prefill", "decode", "environment_queue", "environment_exec",
                         "retries"]].sum(axis=1)
        out["dead"] = self._dead_overlap(sm["admitted_at"], end)
        if self.t0 is not None:  # waiting for admission while the batch was stopped is dead time too
            out["admission_s"] -= self._dead_overlap(pd.Series(self.t0, index=sm.index), sm["admitted_at"])
        out["orchestration"] = (out["latency_s"] - explained - out["dead"]).clip(lower=0).fillna(0.0)
        return out

    def _dead_overlap(self, start: pd.Series, end: pd.Series) -> pd.Series:
        total = pd.Series(0.0, index=start.index)
        for g0, g1 in self.dead_gaps:
            total += (np.minimum(end, g1) - np.maximum(start, g0)).clip(lower=0).fillna(0.0)
        return total

    # --- stopped and resumed batches -----------------------------------------------------------
    @cached_property
    def dead_gaps(self) -> list[tuple[float, float]]:
        """Stretches of at least DEAD_GAP_S between the first step and the end in which no step of any
        sample was queued, running, waiting to retry, or being scored: the batch's process was gone
        (killed, then resumed). Time no schedule spent, so it is kept out of the phases and ratios."""
        st = self.steps
        if st.empty or self.t_end is None:
            return []
        end = st["finished_at"].fillna(st["started_at"])
        # A failed attempt waits (backoff) until the next attempt of its step is queued: busy, not dead.
        nxt = st.sort_values(["sample_id", "index", "attempt"]).groupby(["sample_id", "index"])["enqueued_at"].shift(-1)
        end = end.where(st["status"] != "failed", np.fmax(end, nxt.reindex(st.index)))
        last_step = end.groupby(st["sample_id"]).max()  # scoring: last step -> sample finished
        sm = self.samples.set_index("id")
        starts = np.concatenate([st["enqueued_at"].to_numpy(), last_step.to_numpy()])
        ends = np.concatenate([end.to_numpy(), sm["finished_at"].reindex(last_step.index).to_numpy()])
        ok = np.isfinite(starts) & np.isfinite(ends)
        order = np.argsort(starts[ok], kind="stable")
        s, e = starts[ok][order], np.maximum.accumulate(ends[ok][order])
        gaps = np.nonzero(s[1:] - e[:-1] >= DEAD_GAP_S)[0]
        return [(float(e[i]), float(s[i + 1])) for i in gaps]

    @cached_property
    def dead_s(self) -> float:
        return float(sum(g1 - g0 for g0, g1 in self.dead_gaps))

    @cached_property
    def resumed(self) -> bool:
        """Stopped and resumed: dead time, or attempts a dead process left behind (`abandoned`)."""
        return self.dead_s > 0 or bool((self.steps["status"] == "abandoned").any())

    @cached_property
    def active_s(self) -> float | None:
        """Makespan without the dead time: what two runs' schedules are compared on."""
        return None if self.makespan_s is None else self.makespan_s - self.dead_s

    # --- headline figures ----------------------------------------------------------------------
    def tail_s(self, q: float) -> float | None:
        """Time from the moment a fraction q of the finished samples were done to the last one."""
        f = np.sort(self.samples["finished_at"].dropna().to_numpy(dtype="float64"))
        if f.size == 0:
            return None
        k = max(math.ceil(q * f.size), 1)
        return float(f[-1] - f[k - 1])

    @cached_property
    def lower_bound(self) -> LowerBound | None:
        st = self.completed_steps
        if st.empty:
            return None
        inf = st[st["kind"] == "inference"]
        env = st[st["kind"] == "environment"]
        cap = self.capacity
        # Worker-busy seconds at full batching: each request's service shares the worker with
        # per_worker_inflight others, so it costs service / per_worker_inflight of one worker.
        inf_work = float((inf["prefill_part"] + inf["decode_part"]).sum()) / cap.per_worker_inflight
        return makespan_lower_bound(
            self.per_sample["chain_s"].to_numpy(),
            inference_work_s=inf_work,
            inference_capacity=cap.engine_workers,
            env_work_s=float(env["service_s"].sum()),
            env_slots=cap.env_slots,
        )

    @cached_property
    def lb_ratio(self) -> float | None:
        if self.lower_bound is None or self.makespan_s is None:
            return None
        r = self.lower_bound.ratio(self.makespan_s)
        return None if math.isinf(r) else r

    @cached_property
    def phases(self) -> dict[str, float]:
        ps = self.per_sample
        return {p: float(ps[p].sum()) for p in PHASES}

    @cached_property
    def cache_hit_rate(self) -> float | None:
        inf = self.completed_steps[self.completed_steps["kind"] == "inference"]
        prompt = float(inf["prompt_tokens"].sum())
        if prompt <= 0 or inf["cached_prompt_tokens"].isna().all():
            return None  # the engine did not report cached tokens: unknown, not 0 %
        return float(inf["cached_prompt_tokens"].sum()) / prompt

    @cached_property
    def tokens(self) -> dict[str, int]:
        inf = self.completed_steps[self.completed_steps["kind"] == "inference"]
        return {k: int(inf[c].sum()) for k, c in (
            ("prompt", "prompt_tokens"), ("cached", "cached_prompt_tokens"),
            ("recomputed", "recomputed_tokens"), ("output", "output_tokens"))}

    @cached_property
    def latency(self) -> pd.Series:
        """Latency (admitted -> finished) of finished samples, sorted."""
        ps = self.per_sample
        return ps.loc[ps["finished_at"].notna(), "latency_s"].sort_values().reset_index(drop=True)

    def latency_quantile(self, q: float) -> float | None:
        lat = self.latency
        return float(lat.quantile(q)) if len(lat) else None

    @cached_property
    def score_mean(self) -> float | None:
        s = self.samples["score"].dropna()
        return float(s.mean()) if len(s) else None

    @cached_property
    def host_noise(self) -> float | None:
        """Share of sample time the recorded work does not explain: orchestration gaps plus inference
        wall time beyond what the engine reported (queue + prefill + decode). On a loaded host both
        grow, so two runs of one config differ by about this much (compare.py uses it)."""
        total = sum(self.phases.values())
        if total <= 0:
            return None
        inf = self.completed_steps[(self.completed_steps["kind"] == "inference")
                                   & (self.completed_steps["prefill_s"].notna() | self.completed_steps["decode_s"].notna())]
        reported = _nz(inf["engine_queue_s"]) + _nz(inf["prefill_s"]) + _nz(inf["decode_s"])
        lag = float(((inf["finished_at"] - inf["started_at"]) - reported).clip(lower=0).sum())
        return min(1.0, (self.phases["orchestration"] + lag) / total)

    @cached_property
    def counts(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.samples["status"].value_counts().items()}

    # --- curves --------------------------------------------------------------------------------
    def _window(self) -> tuple[float, float]:
        return (self.t0 or 0.0, self.t_end or 0.0)

    @cached_property
    def worker_curves(self) -> dict[str, pd.DataFrame]:
        """In-flight requests over time per engine worker (every attempt that reached a worker)."""
        inf = self.steps[(self.steps["kind"] == "inference") & self.steps["worker"].notna()]
        return {str(w): occupancy(g["started_at"], g["finished_at"]) for w, g in inf.groupby("worker")}

    @cached_property
    def env_curve(self) -> pd.DataFrame:
        """Busy environment slots over time (every attempt)."""
        env = self.steps[self.steps["kind"] == "environment"]
        return occupancy(env["started_at"], env["finished_at"])

    @cached_property
    def active_curve(self) -> pd.DataFrame:
        """Admitted, unfinished samples over time."""
        end = self.samples["finished_at"].fillna(self.t_end if self.t_end is not None else np.nan)
        return occupancy(self.samples["admitted_at"], end)

    @cached_property
    def env_utilisation(self) -> float:
        """Mean busy slots / env_slots over [t0, t_end]."""
        return time_average(self.env_curve, *self._window()) / self.capacity.env_slots

    @cached_property
    def worker_utilisation(self) -> dict[str, float]:
        """Mean in-flight requests / per_worker_inflight per worker over [t0, t_end]."""
        cap = self.capacity.per_worker_inflight
        return {w: time_average(c, *self._window()) / cap for w, c in self.worker_curves.items()}

    @cached_property
    def mean_active(self) -> float:
        return time_average(self.active_curve, *self._window())

    # --- critical samples ----------------------------------------------------------------------
    def critical_samples(self, k: int = 5) -> list[CriticalSample]:
        """The k samples that finished last (they set the makespan), latest first."""
        ps = self.per_sample[self.per_sample["finished_at"].notna()]
        ps = ps.sort_values("finished_at", ascending=False).head(k)
        out = []
        for sid, r in ps.iterrows():
            waits = {w: float(r[w if w != "admission" else "admission_s"] or 0.0) for w in WAIT_PHASES}
            out.append(CriticalSample(
                sample_id=int(sid), task_id=str(r["task_id"]), finished_s=float(r["finished_at"] - (self.t0 or 0)),
                latency_s=float(r["latency_s"]), steps=int(r["steps"]), chain_s=float(r["chain_s"]),
                waits=waits, waited_on=max(waits, key=lambda w: waits[w]) if any(waits.values()) else "nothing",
            ))
        return out
