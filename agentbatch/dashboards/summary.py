"""The headline figures of a batch, as a dataclass and a short text for the terminal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentbatch.dashboards.analytics import BatchAnalysis, CriticalSample
from agentbatch.dashboards.checks import stopped_in_flight
from agentbatch.dashboards.choice import choice_json, choice_line
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.groups import GroupScore, group_line, group_scores
from agentbatch.db.history import priors_used
from agentbatch.db.store import Store
from agentbatch.scheduling.lower_bound import LowerBound
from agentbatch.scheduling.portfolio import stored_choice


@dataclass
class BatchSummary:
    batch_id: int
    name: str
    status: str
    makespan_s: float | None
    lower_bound: LowerBound | None
    tail_90_s: float | None
    tail_99_s: float | None
    phases: dict[str, float]  # sample-seconds per phase (analytics.PHASES)
    cache_hit_rate: float | None
    recomputed_tokens: int
    score_mean: float | None
    samples_total: int
    samples_completed: int
    samples_failed: int
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    env_utilisation: float | None = None
    worker_utilisation: dict[str, float] = field(default_factory=dict)
    critical: list[CriticalSample] = field(default_factory=list)
    priors: str | None = None  # chain-length priors the batch was admitted with (db/history.py)
    group_scores: dict[str, GroupScore] = field(default_factory=dict)  # by task group (dashboards/groups.py)
    dead_s: float = 0.0  # time the batch was stopped (analytics.dead_gaps), inside the makespan
    resumed: bool = False
    source: str = ""  # the store, when not the report's own (frames.BatchData.source)
    policy_choice: dict[str, Any] | None = None  # what scheduling.policy auto chose (dashboards/choice.py)
    # samples stopped on a step that may have executed: {"sample", "task", "check"} (flows/leased.py)
    stopped_in_flight: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"batch {self.batch_id}" + (f"@{self.source}" if self.source else "")

    @property
    def active_s(self) -> float | None:
        return None if self.makespan_s is None else self.makespan_s - self.dead_s

    @property
    def lb_ratio(self) -> float | None:
        if self.lower_bound is None or self.makespan_s is None or self.lower_bound.value <= 0:
            return None
        return self.makespan_s / self.lower_bound.value

    def as_row(self) -> dict[str, float | int | str | None]:
        """Flat figures, for tables (report, Prefect table artifact, comparisons)."""
        lb = self.lower_bound
        row: dict[str, float | int | str | None] = {
            "batch": self.batch_id, "name": self.name, "status": self.status,
            "samples": self.samples_total, "completed": self.samples_completed, "failed": self.samples_failed,
            "makespan_s": self.makespan_s, "active_s": self.active_s, "dead_s": self.dead_s,
            "resumed": self.resumed, "lower_bound_s": lb.value if lb else None,
            "lb_binding": lb.binding if lb else None, "makespan_over_lb": self.lb_ratio,
            "tail_90_s": self.tail_90_s, "tail_99_s": self.tail_99_s,
            "latency_p50_s": self.latency_p50_s, "latency_p99_s": self.latency_p99_s,
            "env_utilisation": self.env_utilisation,
            "cache_hit_rate": self.cache_hit_rate, "recomputed_tokens": self.recomputed_tokens,
            "score_mean": self.score_mean, "stopped_in_flight": len(self.stopped_in_flight),
        }
        row.update({f"phase_{k}_s": v for k, v in self.phases.items()})
        return row

    def as_json(self) -> dict[str, Any]:
        """summary.json's entry: the figures, the samples stopped for a check (`stopped_in_flight`), and
        `policy_choice` when auto chose the policy."""
        row: dict[str, Any] = {**self.as_row(), "stopped_in_flight": self.stopped_in_flight}
        if self.policy_choice is not None:
            row["policy_choice"] = choice_json(self.policy_choice)
        return row

    def _makespan_lines(self) -> list[str]:
        lb = self.lower_bound
        if self.makespan_s is None:
            return ["  makespan      -  (no sample admitted yet)"]
        lb_txt = (f"lower bound {lb.value:.1f} s ({lb.binding}-bound: chain {lb.longest_chain_s:.1f}, "
                  f"inference {lb.inference_bound_s:.1f}, environment {lb.environment_bound_s:.1f})"
                  if lb else "lower bound -")
        ratio = f", ratio {self.lb_ratio:.2f}" if self.lb_ratio is not None else ""
        lines = [f"  makespan      {self.makespan_s:.1f} s; {lb_txt}{ratio}"]
        if self.resumed:
            lines.append(f"  resumed       stopped and resumed: {self.dead_s:.1f} s dead (no step queued or "
                         f"running), active {self.makespan_s - self.dead_s:.1f} s")
        return lines

    def to_text(self) -> str:
        lines = [f"{self.title} ({self.name}): {self.status}, "
                 f"{self.samples_completed}/{self.samples_total} completed, {self.samples_failed} failed"]
        lines += self._makespan_lines()
        lines.append(f"  tail          90 % -> last {_s(self.tail_90_s)}, 99 % -> last {_s(self.tail_99_s)}; "
                     f"latency p50 {_s(self.latency_p50_s)}, p99 {_s(self.latency_p99_s)}")
        total = sum(self.phases.values())
        if total > 0:
            parts = ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f} %)" for k, v in self.phases.items() if v > 0)
            lines.append(f"  phases        {parts}")
        util = ", ".join(f"{w} {u:.0%}" for w, u in sorted(self.worker_utilisation.items()))
        env = f"{self.env_utilisation:.0%}" if self.env_utilisation is not None else "-"
        lines.append(f"  utilisation   environment slots {env}; engine workers {util or '-'}")
        hit = f"{self.cache_hit_rate:.1%}" if self.cache_hit_rate is not None else "-"
        lines.append(f"  cache         hit rate {hit}, recomputed tokens {self.recomputed_tokens}")
        score = f"{self.score_mean:.4f}" if self.score_mean is not None else "-"
        lines.append(f"  score         mean {score}")
        if by_group := group_line(self.group_scores):
            lines.append(by_group)
        if self.priors:
            lines.append(f"  priors        {self.priors}")
        if self.policy_choice is not None:
            lines.append(choice_line(self.policy_choice))
        lines += [f"  CHECK         sample {s['sample']}: {s['check']}" for s in self.stopped_in_flight]
        if self.critical:
            c = self.critical[0]
            lines.append(f"  last sample   {c.task_id} (id {c.sample_id}) finished at {c.finished_s:.1f} s after "
                         f"{c.steps} steps, chain {c.chain_s:.1f} s, waited most on {c.waited_on} "
                         f"({c.waits.get(c.waited_on, 0.0):.1f} s)")
        return "\n".join(lines)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def summary_from_analysis(a: BatchAnalysis) -> BatchSummary:
    counts = a.counts
    return BatchSummary(
        batch_id=a.data.batch_id,
        name=a.data.name,
        status=a.data.status,
        makespan_s=a.makespan_s,
        lower_bound=a.lower_bound,
        tail_90_s=a.tail_s(0.9),
        tail_99_s=a.tail_s(0.99),
        phases=a.phases,
        cache_hit_rate=a.cache_hit_rate,
        recomputed_tokens=a.tokens["recomputed"],
        score_mean=a.score_mean,
        samples_total=len(a.samples),
        samples_completed=counts.get("completed", 0),
        samples_failed=counts.get("failed", 0),
        latency_p50_s=a.latency_quantile(0.5),
        latency_p99_s=a.latency_quantile(0.99),
        env_utilisation=a.env_utilisation if a.t0 is not None else None,
        worker_utilisation=a.worker_utilisation if a.t0 is not None else {},
        critical=a.critical_samples(5),
        group_scores=group_scores(a.samples.itertuples()),
        dead_s=a.dead_s,
        resumed=a.resumed,
        source=a.data.source,
        policy_choice=stored_choice(a.data.config),
        stopped_in_flight=stopped_in_flight(a.samples.itertuples()),
    )


def summarize(store: Store, batch_id: int) -> BatchSummary:
    """Figures of one batch; raises db.store.UnknownBatch for an unknown id."""
    summary = summary_from_analysis(BatchAnalysis(load_batch(store, batch_id)))
    used = priors_used(store, batch_id)
    summary.priors = used.describe() if used is not None else None
    return summary
