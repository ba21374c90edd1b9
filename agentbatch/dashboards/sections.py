"""Report sections that explain a run: its config and policies, the config diff between compared
runs, failed samples with their reasons, scores per task and per group, and hints derived from the
analytics (what bound the batch and which knob to turn)."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from agentbatch.dashboards import choice, groups
from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.scheduling.portfolio import stored_choice

# The knobs that decide a run's schedule, as (label, path in the stored config).
POLICY_FIELDS = (
    ("engine", "engine.kind"), ("engine workers", "engine.params.workers"),
    ("engine profile", "engine.params.timing.profile"), ("workload", "workload.kind"),
    ("max_active_samples", "scheduling.max_active_samples"), ("env_slots", "scheduling.env_slots"),
    ("per_worker_inflight", "scheduling.per_worker_inflight"), ("coupled", "scheduling.coupled"),
    ("admission_order", "scheduling.admission_order"), ("env_queue", "scheduling.env_queue.name"),
    ("inference_queue", "scheduling.inference_queue.name"), ("router", "scheduling.router.name"),
    ("priority", "scheduling.priority.name"), ("execution mode", "execution.mode"),
    ("max_steps", "limits.max_steps"), ("retries (env, inference)", "retries"),
)
MAX_FAILED_ROWS = 200
MAX_TASK_ROWS = 500


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": leaf} of a nested config (lists stay whole)."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for k, v in config.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _lookup(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, dict):
        return ", ".join(f"{k} {v}" for k, v in node.items() if not isinstance(v, dict))
    return node


def policies_table(analyses: list[BatchAnalysis]) -> pd.DataFrame:
    """One column per batch: the schedule-deciding settings it ran with."""
    cols = {a.data.title: [_lookup(a.data.config, path) for _, path in POLICY_FIELDS]
            for a in analyses}
    table = pd.DataFrame(cols, index=[label for label, _ in POLICY_FIELDS]).astype(object)
    return table.where(table.notna(), "-")


def config_diff(analyses: list[BatchAnalysis]) -> pd.DataFrame:
    """Config fields (flattened) whose values differ between the batches; `name` is left out."""
    flat = [flatten(a.data.config) for a in analyses]
    keys = sorted({k for f in flat for k in f} - {"name"})
    rows = {k: [json.dumps(f.get(k), default=str) if k in f else "(absent)" for f in flat] for k in keys}
    diff = {k: v for k, v in rows.items() if len(set(v)) > 1}
    return pd.DataFrame.from_dict(diff, orient="index",
                                  columns=[a.data.title for a in analyses])


def failed_samples(a: BatchAnalysis, limit: int = MAX_FAILED_ROWS) -> pd.DataFrame:
    """Failed samples with the reason the store recorded (and their failed step attempts)."""
    sm = a.samples[a.samples["status"] == "failed"]
    st = a.steps[a.steps["status"].isin(["failed", "abandoned"])]
    attempts = st.groupby("sample_id").size()
    out = pd.DataFrame({
        "sample": sm["id"].astype(int), "index": sm["index"].astype(int), "task": sm["task_id"],
        "steps done": sm["steps_done"].fillna(0).astype(int),
        "failed attempts": sm["id"].map(attempts).fillna(0).astype(int),
        "reason": sm["error"].astype(object).where(sm["error"].notna(), "(no reason recorded)").astype(str)
        .str.slice(0, 300),
    })
    return out.head(limit).reset_index(drop=True)


def task_scores(a: BatchAnalysis, limit: int = MAX_TASK_ROWS) -> pd.DataFrame:
    """Per task id: samples, completed, failed, mean score and mean steps; lowest score first."""
    sm = a.samples
    g = sm.groupby("task_id")
    out = pd.DataFrame({
        "samples": g.size(), "completed": g["status"].apply(lambda s: int((s == "completed").sum())),
        "failed": g["status"].apply(lambda s: int((s == "failed").sum())),
        "mean score": g["score"].mean(), "mean steps": g["steps_done"].mean(),
    })
    out.index.name = "task"
    return out.sort_values(["mean score", "failed"], ascending=[True, False], na_position="first").head(limit)


def group_scores(a: BatchAnalysis) -> pd.DataFrame:
    """Per task group (suite/category; samples.task_group, dashboards/groups.py): samples, scored,
    failed and mean score. Empty without groups."""
    per = groups.group_scores(a.samples.itertuples(index=False))
    if not per:
        return pd.DataFrame()
    sm = a.samples
    failed = sm[sm["status"] == "failed"].groupby("task_group").size()
    out = pd.DataFrame.from_dict(
        {g: {"samples": s.samples, "scored": s.scored, "failed": int(failed.get(g, 0)), "mean score": s.mean}
         for g, s in per.items()}, orient="index")
    out.index.name = "group"
    return out


@dataclass(frozen=True)
class Hint:
    finding: str
    action: str


def _critical_waits(a: BatchAnalysis) -> tuple[str | None, float]:
    """The wait most of the last-finishing samples waited on, and the share of them that did."""
    crit = a.critical_samples(10)
    if not crit:
        return None, 0.0
    waited = pd.Series([c.waited_on for c in crit]).value_counts()
    return str(waited.index[0]), float(waited.iloc[0]) / len(crit)


def _setting(a: BatchAnalysis, path: str) -> Any:
    return _lookup(a.data.config, path)


def _wait_hint(a: BatchAnalysis) -> Hint | None:
    wait, share = _critical_waits(a)
    if wait is None or share < 0.5:
        return None
    pct = f"{share:.0%} of the samples that finished last"
    busiest = max([a.env_utilisation, *a.worker_utilisation.values()])
    if wait == "admission" and busiest >= 0.8:
        return Hint(f"{pct} waited longest for admission, but the engine workers or environment slots were "
                    f"busy ({busiest:.0%} at most)", "more capacity (workers, env slots), not more admitted "
                    "samples, would shorten this batch")
    if wait == "admission":
        return Hint(f"{pct} waited longest for admission (max_active_samples "
                    f"{_setting(a, 'scheduling.max_active_samples')}).",
                    "raise scheduling.max_active_samples toward the reference concurrency that "
                    "`agentbatch plan` computes for this model and workload")
    if wait == "environment_queue":
        return Hint(f"{pct} waited longest for an environment slot (env_slots "
                    f"{_setting(a, 'scheduling.env_slots')}, utilisation {a.env_utilisation:.0%}).",
                    "raise scheduling.env_slots if the environment backend allows more at once; keep "
                    "env_queue caas so long chains go first")
    if wait == "inference_queue":
        return Hint(f"{pct} waited longest for an engine worker.",
                    "add engine workers or raise per_worker_inflight (see `agentbatch plan` for the KV limit)")
    if wait == "retries":
        return Hint(f"{pct} lost most time to failed attempts.", "look at the failed attempts' errors below")
    return None


def hints(a: BatchAnalysis) -> list[Hint]:
    """What the figures say to change, most telling first."""
    out = [h for h in (_wait_hint(a),) if h is not None]
    failed = int((a.samples["status"] == "failed").sum())
    if failed:
        out.append(Hint(f"{failed} sample(s) failed.", "see the failed samples and their reasons below"))
    if a.lb_ratio is not None and a.lb_ratio <= 1.15:
        out.append(Hint(f"The makespan is within {a.lb_ratio - 1:.0%} of the lower bound.",
                        "little is left to gain from scheduling; more capacity is what shortens it"))
    router = _setting(a, "scheduling.router.name")
    if a.cache_hit_rate is not None and a.cache_hit_rate < 0.5 and router not in (None, "trajectory_aware"):
        out.append(Hint(f"Prefix-cache hit rate {a.cache_hit_rate:.0%} with router {router}.",
                        "use router trajectory_aware: a sample's next call goes to the worker holding its prefix"))
    if a.host_noise is not None and a.host_noise > 0.25:
        out.append(Hint(f"{a.host_noise:.0%} of sample time is host overhead (orchestration gaps, engine lag).",
                        "the host was busy: compare runs by virtual-time replay, not by these wall times"))
    return out


# --- HTML ---------------------------------------------------------------------------------------------
def _table(df: pd.DataFrame, table_id: str) -> str:
    body = df.to_html(classes="figures", float_format=lambda x: f"{x:.4g}", na_rep="-", border=0,
                      table_id=table_id)
    return body


def _section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{html.escape(title)}</h2>{body}</section>'


def hints_html(a: BatchAnalysis) -> str:
    found = hints(a)
    items = "".join(f"<li><b>{html.escape(h.finding)}</b> {html.escape(h.action[:1].upper() + h.action[1:])}.</li>"
                    for h in found) or "<li>Nothing stands out: no wait dominates the last samples.</li>"
    return _section("hints", "Hints", f"<ul>{items}</ul>")


def config_html(analyses: list[BatchAnalysis]) -> str:
    parts = [_table(policies_table(analyses), "policies")]
    if len(analyses) > 1:
        diff = config_diff(analyses)
        parts.append("<h3>Config diff</h3>" + (_table(diff, "config-diff") if not diff.empty else
                     '<p id="config-diff">The configs are identical (apart from the name): differences between '
                     "these runs are run-to-run noise.</p>"))
    for a in analyses:
        text = json.dumps(a.data.config, indent=1, sort_keys=True, default=str)
        parts.append(f"<details><summary>full config of {html.escape(a.data.title)}</summary>"
                     f"<pre>{html.escape(text)}</pre></details>")
    return _section("config", "Config and policies", "".join(parts))


def choice_html(analyses: list[BatchAnalysis]) -> str:
    """What `scheduling.policy: auto` chose for each batch that chose; "" when none did."""
    parts = [choice.choice_html(a.data.title, a.data.key, c) for a in analyses
             if (c := stored_choice(a.data.config)) is not None]
    return _section("policy-choice", "Policy choice", "".join(parts)) if parts else ""


def linked_table(df: pd.DataFrame, table_id: str, column: str, href: Callable[[Any], str]) -> str:
    """A table whose `column` cells link to `href(value)` (a sample's transcript page); every other
    cell is escaped text."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if v != v else f"{v:.4g}"
        return html.escape(str(v))

    shown = df.map(cell)
    shown[column] = [f'<a href="{html.escape(href(v))}">{html.escape(str(v))}</a>' for v in df[column]]
    return shown.to_html(classes="figures", escape=False, border=0, table_id=table_id, index=False)


def sample_href(page: Callable[[BatchAnalysis, int], str], a: BatchAnalysis) -> Callable[[Any], str]:
    """The link of a sample id cell of batch `a` (for `linked_table`)."""
    return lambda sid: page(a, int(sid))


def failed_html(analyses: list[BatchAnalysis], page: Callable[[BatchAnalysis, int], str] | None = None) -> str:
    """The failed samples of each batch; with `page`, each sample id links to its transcript page."""
    parts = []
    for a in analyses:
        df = failed_samples(a)
        head = f"<h3>{html.escape(a.data.title)}: {int((a.samples['status'] == 'failed').sum())} failed</h3>"
        if df.empty:
            parts.append(head + "<p>None.</p>")
        elif page is None:
            parts.append(head + _table(df, f"failed-{a.data.key}"))
        else:
            parts.append(head + linked_table(df, f"failed-{a.data.key}", "sample", sample_href(page, a)))
    return _section("failed-samples", "Failed samples and why", "".join(parts))


def scores_html(analyses: list[BatchAnalysis]) -> str:
    parts = []
    for a in analyses:
        groups = group_scores(a)
        if not groups.empty:
            parts.append(f"<h3>{html.escape(a.data.title)}: per group</h3>" + _table(groups, f"groups-{a.data.key}"))
        tasks = task_scores(a)
        note = f" (lowest {MAX_TASK_ROWS})" if len(tasks) == MAX_TASK_ROWS else ""
        parts.append(f"<h3>{html.escape(a.data.title)}: per task{note}</h3>"
                     f"<details open><summary>{len(tasks)} task ids, lowest score first</summary>"
                     f"{_table(tasks, f'tasks-{a.data.key}')}</details>")
    return _section("scores", "Scores per group and per task", "".join(parts))
