"""Side-by-side figures of two or more batches (same tasks, different policies), with ratios to the
first, and a check that their scores agree task by task."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.groups import compare_lines
from agentbatch.dashboards.sections import config_diff
from agentbatch.dashboards.summary import BatchSummary, summary_from_analysis

# Figures compared with a ratio to the first batch (lower is better for all but cache/utilisation/score).
RATIO_FIGURES = ("makespan_s", "lower_bound_s", "makespan_over_lb", "tail_90_s", "tail_99_s",
                 "latency_p50_s", "latency_p99_s", "env_utilisation", "cache_hit_rate", "recomputed_tokens",
                 "score_mean", "phase_inference_queue_s", "phase_prefill_s", "phase_decode_s",
                 "phase_environment_queue_s", "phase_environment_exec_s", "phase_retries_s",
                 "phase_orchestration_s")


@dataclass
class ScoreCheck:
    """Per-task mean scores of each batch against the first."""

    agree: bool
    tasks_compared: int
    mismatched: list[str] = field(default_factory=list)  # task ids whose mean score differs
    missing: list[str] = field(default_factory=list)  # task ids absent from, or unscored in, some batch
    table: pd.DataFrame = field(default_factory=pd.DataFrame)  # task_id x batch: mean score


MIN_SPREAD = 0.05  # run-to-run spread assumed even on an idle host (timer and scheduling jitter)


@dataclass
class Comparison:
    summaries: list[BatchSummary]
    figures: pd.DataFrame  # rows: figures; columns: "batch N" values and "ratio N" to the first
    scores: ScoreCheck
    spread: float = MIN_SPREAD  # relative makespan difference this host's noise can explain
    config_diff: pd.DataFrame = field(default_factory=pd.DataFrame)  # differing config fields x batches

    def within_noise(self, s: BatchSummary) -> bool | None:
        r = _ratio(s.makespan_s, self.summaries[0].makespan_s)
        return None if r is None else abs(r - 1.0) <= self.spread

    def to_text(self) -> str:
        base = self.summaries[0]
        lines = [f"comparison against batch {base.batch_id} ({base.name})"]
        for s in self.summaries[1:]:
            r = _ratio(s.makespan_s, base.makespan_s)
            noise = {True: f"within this host's run-to-run spread (+-{self.spread:.0%}): not a measured difference",
                     False: f"beyond this host's run-to-run spread (+-{self.spread:.0%})", None: "-"}
            lines.append(f"  batch {s.batch_id} ({s.name}): makespan {_f(s.makespan_s)} s = {_f(r, 3)} x batch "
                         f"{base.batch_id}; tail 90 % {_f(s.tail_90_s)} s vs {_f(base.tail_90_s)} s; "
                         f"{noise[self.within_noise(s)]}")
        lines.extend(self._config_lines())
        sc = self.scores
        verdict = "agree" if sc.agree else "DIFFER"
        lines.append(f"  scores {verdict} on {sc.tasks_compared} task ids"
                     + (f"; mismatched: {', '.join(sc.mismatched[:10])}" if sc.mismatched else "")
                     + (f"; missing: {', '.join(sc.missing[:10])}" if sc.missing else ""))
        lines.extend(compare_lines([(s.batch_id, s.group_scores) for s in self.summaries]))
        return "\n".join(lines)

    def _config_lines(self) -> list[str]:
        d = self.config_diff
        if d.empty:
            lines = ["  config        identical (apart from the name): differences are run-to-run noise"]
        else:
            shown = "; ".join(f"{k}: {' vs '.join(str(v) for v in row)}" for k, row in d.head(8).iterrows())
            lines = [f"  config        {len(d)} field(s) differ: {shown}"]
        if d.empty or any(self.within_noise(s) for s in self.summaries[1:]):
            lines.append("  exact         replay both configs in virtual time (no host noise): `agentbatch trace "
                         "export ID --out t.parquet`, then `agentbatch replay t.parquet ...` (docs/replay.md)")
        return lines


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ratio(x: object, base: object) -> float | None:
    if not isinstance(x, (int, float)) or not isinstance(base, (int, float)) or base == 0:
        return None
    if math.isnan(float(x)) or math.isnan(float(base)):
        return None
    return float(x) / float(base)


def check_scores(analyses: list[BatchAnalysis], tol: float = 1e-9) -> ScoreCheck:
    cols = {}
    for a in analyses:
        sm = a.samples
        cols[f"batch {a.data.batch_id}"] = sm.groupby("task_id")["score"].mean()
    table = pd.DataFrame(cols)
    table.index.name = "task_id"
    missing = sorted(str(t) for t in table.index[table.isna().any(axis=1)])
    full = table.dropna()
    base = full.iloc[:, 0]
    diff = full.sub(base, axis=0).abs().gt(tol).any(axis=1)
    mismatched = sorted(str(t) for t in full.index[diff])
    return ScoreCheck(agree=not mismatched and not missing, tasks_compared=len(table),
                      mismatched=mismatched, missing=missing, table=table)


def compare(analyses: list[BatchAnalysis]) -> Comparison:
    if len(analyses) < 2:
        raise ValueError("compare needs two or more batches")
    summaries = [summary_from_analysis(a) for a in analyses]
    rows = [s.as_row() for s in summaries]
    base = rows[0]
    data: dict[str, list[object]] = {}
    for s, row in zip(summaries, rows, strict=True):
        data[f"batch {s.batch_id}"] = [row.get(k) for k in RATIO_FIGURES]
        if s is not summaries[0]:
            data[f"ratio {s.batch_id}"] = [_ratio(row.get(k), base.get(k)) for k in RATIO_FIGURES]
    figures = pd.DataFrame(data, index=list(RATIO_FIGURES))
    noise = [a.host_noise for a in analyses if a.host_noise is not None]
    return Comparison(summaries=summaries, figures=figures, scores=check_scores(analyses),
                      spread=max([MIN_SPREAD, *noise]), config_diff=config_diff(analyses))
