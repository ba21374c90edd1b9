"""Run history of a suite and diffs between runs: per-run figures, per-task score changes with
regression flags, and the report's history section (score and makespan over runs).

A task **regressed** when its score fell by more than the threshold, or it completed before and
failed after; it was **fixed** the other way round. A group (and the overall mean) is flagged when
its mean score fell by more than the threshold; the makespan when it grew by more than the
makespan threshold (a ratio, off by default: it moves with the machine's load).
"""

from __future__ import annotations

import html
import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import select

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.charts_html import chart, line
from agentbatch.dashboards.frames import load_batch
from agentbatch.db import history as db_history
from agentbatch.db.models import Sample
from agentbatch.db.store import Store

log = logging.getLogger(__name__)
EPS = 1e-9
HISTORY_RUNS = 50  # runs shown in the report's history section


@dataclass
class RunFigures:
    """One run of a suite, as `history` lists it."""

    batch_id: int
    name: str
    created_at: float
    status: str
    tag: str  # the run's checkpoint tag, else the model(s) it called
    deployment: str | None
    samples: int
    failed: int
    score: float | None
    group_scores: dict[str, float]
    makespan_s: float | None
    lb_ratio: float | None
    priors: str  # "suite x3", "task ids x1" or "-"

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.created_at))


def model_label(config: dict[str, Any]) -> str:
    """The model(s) a batch called: endpoint models, else the engine kind."""
    engine = config.get("engine") or {}
    params = engine.get("params") or {}
    models = [str(e["model"]) for e in params.get("endpoints") or [] if isinstance(e, dict) and e.get("model")]
    if params.get("model"):
        models.append(str(params["model"]))
    return ",".join(dict.fromkeys(models)) or str(engine.get("kind", "-"))


def task_scores(store: Store, batch_id: int) -> pd.DataFrame:
    """Per task id: mean score (failed samples: NaN), whether any sample failed, and its group."""
    with store.session() as s:
        rows = list(s.scalars(select(Sample).where(Sample.batch_id == batch_id)))
    records = []
    for r in rows:
        task = r.task or {}
        group = getattr(r, "task_group", None) or task.get("group") or task.get("category") or ""
        records.append({"task_id": r.task_id, "score": r.score, "failed": r.status == "failed", "group": group})
    if not records:
        return pd.DataFrame({"score": pd.Series(dtype="float64"), "failed": pd.Series(dtype=bool),
                             "group": pd.Series(dtype=object)}, index=pd.Index([], name="task_id"))
    df = pd.DataFrame(records)
    df["score"] = pd.to_numeric(df["score"], errors="coerce").astype("float64")
    return df.groupby("task_id").agg(score=("score", "mean"), failed=("failed", "any"), group=("group", "first"))


def _group_means(scores: pd.DataFrame) -> dict[str, float]:
    grouped = scores[scores["group"] != ""].dropna(subset=["score"]).groupby("group")["score"].mean()
    return {str(g): float(v) for g, v in grouped.items()}


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def run_figures(store: Store, batch_id: int) -> RunFigures:
    """Figures of one run; raises db.store.UnknownBatch for an unknown id."""
    a = BatchAnalysis(load_batch(store, batch_id))
    row = db_history.ensure_suite_row(store, batch_id)
    scores = task_scores(store, batch_id)
    counts = a.counts
    priors = (f"{'suite' if row.priors_source == 'suite' else 'task ids'} x{row.priors_runs}"
              if row.priors_source else "-")
    return RunFigures(
        batch_id=batch_id, name=a.data.name, created_at=a.data.created_at, status=a.data.status,
        tag=row.tag or model_label(a.data.config), deployment=row.deployment, samples=len(a.samples),
        failed=counts.get("failed", 0), score=_num(a.score_mean), group_scores=_group_means(scores),
        makespan_s=_num(a.makespan_s), lb_ratio=_num(a.lb_ratio), priors=priors,
    )


def suite_history(store: Store, key: str, limit: int | None = None, up_to: int | None = None) -> list[RunFigures]:
    """The suite's runs, oldest first (the last `limit` when given; none after batch `up_to`)."""
    runs = [r for r in db_history.suite_runs(store, key) if up_to is None or r.batch_id <= up_to]
    if limit is not None:
        runs = runs[-limit:]
    return [run_figures(store, r.batch_id) for r in runs]


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def history_table(runs: list[RunFigures]) -> pd.DataFrame:
    groups = sorted({g for r in runs for g in r.group_scores})
    rows = []
    for r in runs:
        row: dict[str, Any] = {"batch": r.batch_id, "date (UTC)": r.date, "tag": r.tag, "status": r.status,
                               "score": r.score}
        row.update({f"score {g}": r.group_scores.get(g) for g in groups})
        row.update({"makespan_s": r.makespan_s, "makespan/LB": r.lb_ratio,
                    "failed": f"{r.failed}/{r.samples}", "priors": r.priors})
        rows.append(row)
    return pd.DataFrame(rows)


def history_text(key: str, runs: list[RunFigures]) -> str:
    if not runs:
        return f"suite {key}: no runs"
    head = f"suite {key}: {len(runs)} run(s) of {runs[-1].samples} task(s) ({runs[-1].name})"
    table = history_table(runs).to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.3f}")
    return head + "\n" + table


# --- diffs -------------------------------------------------------------------------------------


@dataclass
class TaskChange:
    task_id: str
    group: str
    before: float | None
    after: float | None
    before_failed: bool
    after_failed: bool


@dataclass
class GroupDelta:
    group: str  # "(overall)" for the mean over every scored task
    before: float | None
    after: float | None
    delta: float | None
    regressed: bool


@dataclass
class RunDiff:
    before: RunFigures
    after: RunFigures
    same_suite: bool
    threshold: float
    makespan_threshold: float | None
    regressed: list[TaskChange] = field(default_factory=list)
    fixed: list[TaskChange] = field(default_factory=list)
    only_before: list[str] = field(default_factory=list)
    only_after: list[str] = field(default_factory=list)
    groups: list[GroupDelta] = field(default_factory=list)
    makespan_ratio: float | None = None
    makespan_regressed: bool = False

    @property
    def regressions(self) -> int:
        """Regressed tasks."""
        return len(self.regressed)

    @property
    def flags(self) -> list[str]:
        """Every regression beyond its threshold, in words."""
        out = [f"task {c.task_id}: {_f(c.before)} -> {_f(c.after)}" + (" (failed)" if c.after_failed else "")
               for c in self.regressed]
        out += [f"group {g.group}: mean score {_f(g.before)} -> {_f(g.after)} ({g.delta:+.3f})"
                for g in self.groups if g.regressed and g.delta is not None]
        if self.makespan_regressed and self.makespan_ratio is not None:
            out.append(f"makespan x{self.makespan_ratio:.2f} (threshold x{1 + (self.makespan_threshold or 0):.2f})")
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regressions"] = self.regressions
        d["flags"] = self.flags
        return d

    def to_text(self) -> str:
        b, a = self.before, self.after
        lines = [f"diff: batch {b.batch_id} ({b.tag}, {b.date}) -> batch {a.batch_id} ({a.tag}, {a.date})"]
        if not self.same_suite:
            lines.append("  note: different suites; tasks compared on the task ids both ran")
        for label, changes in (("regressed", self.regressed), ("fixed", self.fixed)):
            ids = ", ".join(c.task_id for c in changes[:20]) + (", ..." if len(changes) > 20 else "")
            lines.append(f"  {label:<10} {len(changes)}" + (f": {ids}" if ids else ""))
        if self.only_before or self.only_after:
            lines.append(f"  only in {b.batch_id}: {len(self.only_before)}; only in {a.batch_id}: {len(self.only_after)}")
        for g in self.groups:
            mark = "  REGRESSED" if g.regressed else ""
            delta = "-" if g.delta is None else f"{g.delta:+.3f}"
            lines.append(f"  score {g.group:<24} {_f(g.before)} -> {_f(g.after)}  ({delta}){mark}")
        ratio = f" (x{self.makespan_ratio:.2f})" if self.makespan_ratio is not None else ""
        lines.append(f"  makespan   {_f(b.makespan_s, '.1f')} s -> {_f(a.makespan_s, '.1f')} s{ratio}"
                     + ("  REGRESSED" if self.makespan_regressed else ""))
        lines.append(f"  regressions: {self.regressions} task(s) beyond threshold {self.threshold:g}; "
                     f"{len(self.flags)} flag(s)")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        b, a = self.before, self.after
        verdict = f"**{self.regressions} regressed task(s)**" if self.regressions else "no regressed task"
        lines = [f"# agentbatch diff: batch {a.batch_id} vs previous run {b.batch_id}", "",
                 f"Suite run {_md(a.name)} ({_md(a.tag)}, {a.date} UTC) against batch {b.batch_id} ({_md(b.tag)}, {b.date} UTC): "
                 f"{verdict}, {len(self.fixed)} fixed; score threshold {self.threshold:g}.", ""]
        if self.flags:
            lines += ["## Regressions", ""] + [f"- :warning: {_md(f)}" for f in self.flags] + [""]
        lines += ["| group | before | after | delta |", "|---|---|---|---|"]
        lines += [f"| {_md(g.group)} | {_f(g.before)} | {_f(g.after)} | "
                  f"{'-' if g.delta is None else format(g.delta, '+.3f')}{' **regressed**' if g.regressed else ''} |"
                  for g in self.groups]
        ratio = f"x{self.makespan_ratio:.2f}" if self.makespan_ratio is not None else "-"
        lines += ["", f"Makespan {_f(b.makespan_s, '.1f')} s -> {_f(a.makespan_s, '.1f')} s ({ratio}); "
                  f"makespan / lower bound {_f(b.lb_ratio, '.2f')} -> {_f(a.lb_ratio, '.2f')}."]
        if self.fixed:
            lines += ["", "Fixed: " + ", ".join(_md(c.task_id) for c in self.fixed[:50])]
        return "\n".join(lines)


_MD_ESCAPES = str.maketrans({"<": "&lt;", ">": "&gt;", **{c: "\\" + c for c in "`*_[]|\\"}})


def _md(text: str) -> str:
    """Text for a markdown artifact: no raw HTML or markdown markup from task ids and names."""
    return text.replace(" -> ", " → ").translate(_MD_ESCAPES)


def _score_or_zero(score: float | None, failed: bool) -> float:
    return 0.0 if failed or score is None else score


def _task_changes(before: pd.DataFrame, after: pd.DataFrame, threshold: float) -> tuple[list[TaskChange], list[TaskChange]]:
    regressed, fixed = [], []
    for task_id in sorted(set(before.index) & set(after.index)):
        b, a = before.loc[task_id], after.loc[task_id]
        change = TaskChange(str(task_id), str(a["group"] or b["group"]), _num(b["score"]), _num(a["score"]),
                            bool(b["failed"]), bool(a["failed"]))
        sb = _score_or_zero(change.before, change.before_failed)
        sa = _score_or_zero(change.after, change.after_failed)
        if sa < sb - threshold - EPS or (change.after_failed and not change.before_failed):
            regressed.append(change)
        elif sa > sb + threshold + EPS or (change.before_failed and not change.after_failed):
            fixed.append(change)
    return regressed, fixed


def _group_deltas(before: RunFigures, after: RunFigures, threshold: float) -> list[GroupDelta]:
    out = []
    pairs = [("(overall)", before.score, after.score)]
    pairs += [(g, before.group_scores.get(g), after.group_scores.get(g))
              for g in sorted(set(before.group_scores) | set(after.group_scores))]
    for group, b, a in pairs:
        delta = None if a is None or b is None else a - b
        out.append(GroupDelta(group, b, a, delta, delta is not None and delta < -threshold - EPS))
    return out


def diff_runs(store: Store, before_id: int, after_id: int, *, threshold: float = 0.0,
              makespan_threshold: float | None = None) -> RunDiff:
    """Compare two runs (normally of one suite); raises db.store.UnknownBatch for an unknown id."""
    before, after = run_figures(store, before_id), run_figures(store, after_id)
    sb, sa = task_scores(store, before_id), task_scores(store, after_id)
    regressed, fixed = _task_changes(sb, sa, threshold)
    same = db_history.ensure_suite_row(store, before_id).suite_key == db_history.ensure_suite_row(store, after_id).suite_key
    ratio = (after.makespan_s / before.makespan_s
             if after.makespan_s is not None and before.makespan_s else None)
    return RunDiff(
        before=before, after=after, same_suite=same, threshold=threshold, makespan_threshold=makespan_threshold,
        regressed=regressed, fixed=fixed,
        only_before=sorted(str(t) for t in set(sb.index) - set(sa.index)),
        only_after=sorted(str(t) for t in set(sa.index) - set(sb.index)),
        groups=_group_deltas(before, after, threshold), makespan_ratio=ratio,
        makespan_regressed=(makespan_threshold is not None and ratio is not None
                            and ratio > 1 + makespan_threshold + EPS),
    )


def diff_with_previous(store: Store, batch_id: int, *, threshold: float = 0.0,
                       makespan_threshold: float | None = None) -> RunDiff | None:
    """The batch against the previous finished run of its suite; None for a suite's first run."""
    prev = db_history.previous_run(store, batch_id)
    if prev is None:
        return None
    return diff_runs(store, prev, batch_id, threshold=threshold, makespan_threshold=makespan_threshold)


# --- the report's history section ---------------------------------------------------------------


def history_charts(runs: list[RunFigures]) -> list[dict[str, Any]]:
    """Score and makespan over the suite's runs (x: the run's position, labelled batch and tag)."""
    x = list(range(len(runs)))
    names = [f"batch {r.batch_id} {r.tag or ''}".strip() for r in runs]
    return [chart("chart-history-score", "Runs of this suite: mean score", "line",
                  [line(x, [r.score for r in runs], "mean score", "#1F77B4", markers=1),
                   line(x, [r.score for r in runs], "mean score", "#1F77B4")],
                  xlabel="run, oldest first", ylabel="mean score", height=260, xticks=names),
            chart("chart-history-makespan", "Runs of this suite: makespan", "line",
                  [line(x, [r.makespan_s for r in runs], "makespan (s)", "#FF7F0E", markers=1),
                   line(x, [r.makespan_s for r in runs], "makespan (s)", "#FF7F0E")],
                  xlabel="run, oldest first", ylabel="seconds", height=260, xticks=names)]


def history_section_html(store: Store, batch_id: int, limit: int = HISTORY_RUNS) -> tuple[str, list[dict[str, Any]]]:
    """The report's "History" section: the suite's runs up to this batch (table and charts)."""
    key = db_history.ensure_suite_row(store, batch_id).suite_key
    runs = suite_history(store, key, limit=limit, up_to=batch_id)
    parts = [f"<h2>History (suite {html.escape(key)})</h2>"]
    if len(runs) < 2:
        parts.append("<p>First run of this suite: nothing to compare yet. `agentbatch history` lists a "
                     "suite's runs, `agentbatch diff A B` compares two.</p>")
        return "".join(parts), []
    parts.append(f"<p>{len(runs)} run(s) of the same workload and task ids, oldest first.</p>")
    charts = history_charts(runs)
    parts += [f'<div class="chart" id="{c["id"]}"></div>' for c in charts]
    table = history_table(runs)
    parts.append(table.to_html(classes="figures", float_format=lambda x: f"{x:.4g}", na_rep="-", border=0,
                               index=False))
    return "".join(parts), charts


# --- the scheduled run's Prefect artifact --------------------------------------------------------


def diff_artifact_key(batch_id: int, deployment: str | None, suite: str) -> str:
    """One key per deployment (else per suite): the Prefect UI keeps each run's diff as a version."""
    base = deployment.split("/", 1)[-1] if deployment else f"suite-{suite}"
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or f"batch-{batch_id}"
    return f"agentbatch-diff-{slug}"[:100]


def first_run_markdown(store: Store, batch_id: int) -> str:
    row = db_history.ensure_suite_row(store, batch_id)
    return (f"# agentbatch diff: batch {batch_id}\n\nFirst finished run of suite {row.suite_key} "
            f"({row.tasks} task(s)): nothing to compare yet.")


async def publish_diff_artifact(store: Store, batch_id: int, diff: RunDiff | None, deployment: str | None) -> None:
    """A markdown artifact with the run's diff against the suite's previous run (no-op outside a
    Prefect run; API errors are logged, never raised: the dashboard must not fail the batch)."""
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return
    from prefect.artifacts import acreate_markdown_artifact

    suite = db_history.ensure_suite_row(store, batch_id).suite_key
    markdown = diff.to_markdown() if diff is not None else first_run_markdown(store, batch_id)
    try:
        await acreate_markdown_artifact(
            markdown=markdown, key=diff_artifact_key(batch_id, deployment, suite),
            description=f"agentbatch batch {batch_id}: diff against the previous run of suite {suite}"
            + (f" ({diff.regressions} regressed task(s))" if diff is not None else ""))
    except Exception as exc:  # noqa: BLE001
        log.warning("cannot publish the diff artifact of batch %s: %s", batch_id, exc)
