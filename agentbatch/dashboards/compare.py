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
RATIO_FIGURES = ("makespan_s", "active_s", "dead_s", "lower_bound_s", "makespan_over_lb", "tail_90_s", "tail_99_s",
                 "latency_p50_s", "latency_p99_s", "env_utilisation", "cache_hit_rate", "recomputed_tokens",
                 "score_mean", "phase_inference_queue_s", "phase_prefill_s", "phase_decode_s",
                 "phase_environment_queue_s", "phase_environment_exec_s", "phase_retries_s",
                 "phase_orchestration_s")


SHOWN_TASKS = 10  # task ids listed per pair in the text (all of them in the report's table)


@dataclass
class PairCheck:
    """Two batches' mean scores per task id."""

    first: str  # batch titles
    second: str
    compared: int  # task ids scored in both
    differ: list[str] = field(default_factory=list)  # scored in both, mean scores differ
    missing: list[str] = field(default_factory=list)  # scored in one only

    @property
    def agree(self) -> bool:
        return not self.differ and not self.missing

    def to_text(self) -> str:
        head = f"{self.first} vs {self.second}: "
        if self.agree:
            return head + f"agree on {self.compared} task ids"
        parts = []
        if self.differ:
            parts.append(f"{len(self.differ)} of {self.compared} task ids differ ({_listed(self.differ)})")
        if self.missing:
            parts.append(f"{len(self.missing)} scored in one only ({_listed(self.missing)})")
        return head + "; ".join(parts)


def _listed(ids: list[str]) -> str:
    more = len(ids) - SHOWN_TASKS
    return ", ".join(ids[:SHOWN_TASKS]) + (f" and {more} more" if more > 0 else "")


@dataclass
class ScoreCheck:
    """Per-task mean scores of each batch against the first, and of every pair of batches."""

    agree: bool
    tasks_compared: int
    mismatched: list[str] = field(default_factory=list)  # task ids whose mean score differs
    missing: list[str] = field(default_factory=list)  # task ids absent from, or unscored in, some batch
    table: pd.DataFrame = field(default_factory=pd.DataFrame)  # task_id x batch: mean score
    pairs: list[PairCheck] = field(default_factory=list)  # every pair of batches, in order


MIN_SPREAD = 0.05  # run-to-run spread assumed even on an idle host (timer and scheduling jitter)


@dataclass
class Comparison:
    summaries: list[BatchSummary]
    figures: pd.DataFrame  # rows: figures; columns: "batch N" values and "ratio N" to the first
    scores: ScoreCheck
    spread: float = MIN_SPREAD  # relative makespan difference this host's noise can explain
    config_diff: pd.DataFrame = field(default_factory=pd.DataFrame)  # differing config fields x batches

    @property
    def by_active_time(self) -> bool:
        """A stopped and resumed batch is compared on its active time (makespan less dead time)."""
        return any(s.resumed for s in self.summaries)

    def _time(self, s: BatchSummary) -> float | None:
        return s.active_s if self.by_active_time else s.makespan_s

    def within_noise(self, s: BatchSummary) -> bool | None:
        r = _ratio(self._time(s), self._time(self.summaries[0]))
        return None if r is None else abs(r - 1.0) <= self.spread

    def _batch_line(self, s: BatchSummary) -> str:
        base = self.summaries[0]
        r = _ratio(self._time(s), self._time(base))
        noise = {True: f"within this host's run-to-run spread (+-{self.spread:.0%}): not a measured difference",
                 False: f"beyond this host's run-to-run spread (+-{self.spread:.0%})", None: "-"}
        if self.by_active_time:
            dead = f" (resumed: {_f(s.dead_s)} s dead)" if s.resumed else ""
            what = (f"makespan {_f(s.makespan_s)} s{dead}, active {_f(s.active_s)} s = {_f(r, 3)} x {base.title}'s "
                    f"active time")
        else:
            what = f"makespan {_f(s.makespan_s)} s = {_f(r, 3)} x {base.title}"
        return (f"  {s.title} ({s.name}): {what}; tail 90 % {_f(s.tail_90_s)} s vs {_f(base.tail_90_s)} s; "
                f"{noise[self.within_noise(s)]}")

    def to_text(self) -> str:
        base = self.summaries[0]
        lines = [f"comparison against {base.title} ({base.name})"]
        if base.resumed:
            lines.append(f"  {base.title} was stopped and resumed: {_f(base.dead_s)} s dead, active {_f(base.active_s)} s")
        lines += [self._batch_line(s) for s in self.summaries[1:]]
        lines.extend(self._config_lines())
        sc = self.scores
        verdict = "agree" if sc.agree else "DIFFER"
        lines.append(f"  scores {verdict} on {sc.tasks_compared} task ids")
        lines += [f"    {p.to_text()}" for p in sc.pairs]
        lines.extend(compare_lines([(s.title, s.group_scores) for s in self.summaries]))
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


def _pair(table: pd.DataFrame, first: str, second: str, tol: float) -> PairCheck:
    a, b = table[first], table[second]
    both = a.notna() & b.notna()
    differ = both & (a - b).abs().gt(tol)
    return PairCheck(first=first, second=second, compared=int(both.sum()),
                     differ=sorted(str(t) for t in table.index[differ]),
                     missing=sorted(str(t) for t in table.index[a.notna() ^ b.notna()]))


def check_scores(analyses: list[BatchAnalysis], tol: float = 1e-9) -> ScoreCheck:
    cols = {}
    for a in analyses:
        sm = a.samples
        cols[a.data.title] = sm.groupby("task_id")["score"].mean()
    table = pd.DataFrame(cols)
    table.index.name = "task_id"
    missing = sorted(str(t) for t in table.index[table.isna().any(axis=1)])
    full = table.dropna()
    base = full.iloc[:, 0]
    diff = full.sub(base, axis=0).abs().gt(tol).any(axis=1)
    mismatched = sorted(str(t) for t in full.index[diff])
    names = list(table.columns)
    pairs = [_pair(table, x, y, tol) for i, x in enumerate(names) for y in names[i + 1:]]
    return ScoreCheck(agree=not mismatched and not missing, tasks_compared=len(table),
                      mismatched=mismatched, missing=missing, table=table, pairs=pairs)


def compare(analyses: list[BatchAnalysis]) -> Comparison:
    if len(analyses) < 2:
        raise ValueError("compare needs two or more batches")
    summaries = [summary_from_analysis(a) for a in analyses]
    rows = [s.as_row() for s in summaries]
    base = rows[0]
    data: dict[str, list[object]] = {}
    for s, row in zip(summaries, rows, strict=True):
        data[s.title] = [row.get(k) for k in RATIO_FIGURES]
        if s is not summaries[0]:
            data[f"ratio {s.title.removeprefix('batch ')}"] = [_ratio(row.get(k), base.get(k)) for k in RATIO_FIGURES]
    figures = pd.DataFrame(data, index=list(RATIO_FIGURES))
    noise = [a.host_noise for a in analyses if a.host_noise is not None]
    return Comparison(summaries=summaries, figures=figures, scores=check_scores(analyses),
                      spread=max([MIN_SPREAD, *noise]), config_diff=config_diff(analyses))
