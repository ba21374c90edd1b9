"""The batch report: one self-contained HTML page (plotly.js inlined once, so it works offline) and
PNG versions of the key charts, written to a folder."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from sqlalchemy.exc import DBAPIError

from agentbatch.dashboards import charts_html, charts_png, sections
from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.compare import compare
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.history import history_section_html
from agentbatch.dashboards.inert import with_csp
from agentbatch.dashboards.summary import BatchSummary, summary_from_analysis
from agentbatch.db.store import Store

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
pre { background: #f6f6f6; padding: 12px; white-space: pre-wrap; }
table.figures { border-collapse: collapse; font-size: 0.9em; }
table.figures td, table.figures th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
.bad { color: #cb181d; font-weight: bold; } .good { color: #31a354; font-weight: bold; }
.chart { margin: 12px 0; }
"""


def default_out_dir(batch_id: int) -> Path:
    return Path("reports") / f"batch-{batch_id}"


def _table(df: pd.DataFrame) -> str:
    return df.to_html(classes="figures", float_format=lambda x: f"{x:.4g}", na_rep="-", border=0)


def _chart(fig: go.Figure, div_id: str) -> str:
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
    return f'<div class="chart">{body}</div>'


def _critical_table(a: BatchAnalysis) -> pd.DataFrame:
    rows = []
    for c in a.critical_samples(10):
        row = {"sample": c.sample_id, "task": c.task_id, "finished_s": c.finished_s, "latency_s": c.latency_s,
               "steps": c.steps, "chain_s": c.chain_s, "waited_on": c.waited_on}
        row.update({f"{k}_s": v for k, v in c.waits.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _summary_json(summaries: list[BatchSummary]) -> str:
    return json.dumps([s.as_row() for s in summaries], indent=1, default=str)


def _comparison_html(analyses: list[BatchAnalysis]) -> str:
    cmp = compare(analyses)
    ok = cmp.scores.agree
    parts = ["<h2>Comparison (ratios to the first batch)</h2>",
             '<pre id="comparison-text">' + html.escape(cmp.to_text()) + "</pre>", _table(cmp.figures)]
    verdict = "agree" if ok else "DIFFER"
    parts.append(f'<p class="{"good" if ok else "bad"}">Scores {verdict} per task id '
                 f"({cmp.scores.tasks_compared} task ids; mismatched {len(cmp.scores.mismatched)}, "
                 f"missing {len(cmp.scores.missing)}).</p>")
    if not ok:
        bad = cmp.scores.table.loc[cmp.scores.mismatched + cmp.scores.missing]
        parts.append(_table(bad.head(50)))
    return "".join(parts)


def _figures_html(summary: BatchSummary) -> str:
    row = pd.DataFrame([summary.as_row()]).T
    row.columns = [f"batch {summary.batch_id}"]
    return "<h2>Figures</h2>" + _table(row)


def _history_html(store: Store, batch_id: int) -> str:
    try:
        return history_section_html(store, batch_id)
    except DBAPIError as exc:  # e.g. a read-only store without the suite row history wants to write
        return f"<h2>History</h2><p>Not available from this store: {html.escape(str(exc.orig))}</p>"


def write_report(store: Store, batch_ids: list[int], out_dir: Path) -> Path:
    """Write index.html (+ PNGs and summary.json) for the first batch, compared with the others.

    Returns the path of index.html. Raises frames.UnknownBatch for an unknown id."""
    if not batch_ids:
        raise ValueError("write_report needs at least one batch id")
    return write_report_for([BatchAnalysis(load_batch(store, b)) for b in batch_ids], out_dir, store=store)


def write_report_for(analyses: list[BatchAnalysis], out_dir: Path, store: Store | None = None) -> Path:
    """write_report over batches already loaded (the first is the main one); with the store, also the
    history of the main batch's suite."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    main = analyses[0]
    summaries = [summary_from_analysis(a) for a in analyses]

    parts: list[str] = []
    title = f"agentbatch report: batch {main.data.batch_id} ({main.data.name})"
    if len(analyses) > 1:
        title += " vs " + ", ".join(f"batch {a.data.batch_id}" for a in analyses[1:])
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts.append(f"<p>Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Times are seconds from "
                 "each batch's first admitted sample (t0). Definitions: docs/dashboards.md.</p>")
    parts.append("<h2>Summary</h2>")
    parts.append("<pre>" + html.escape("\n\n".join(s.to_text() for s in summaries)) + "</pre>")
    parts += [sections.hints_html(main), sections.config_html(analyses)]  # what to change; what ran

    parts.append(_comparison_html(analyses) if len(analyses) > 1 else _figures_html(summaries[0]))
    if store is not None:  # score and makespan over the runs of the suite (dashboards/history.py)
        parts.append(_history_html(store, main.data.batch_id))
    parts.append("<h2>Tail and latency</h2>")
    parts.append(_chart(charts_html.completion(analyses), "chart-completion"))
    parts.append(_chart(charts_html.latency_cdf(analyses), "chart-latency"))
    parts.append("<h2>Utilisation and active samples</h2>")
    for i, a in enumerate(analyses):
        parts.append(_chart(charts_html.utilisation(a), f"chart-utilisation-{i}"))
    if len(analyses) > 1:
        parts.append(_chart(charts_html.env_utilisation_compare(analyses), "chart-env-compare"))
    parts.append(_chart(charts_html.active_samples(analyses), "chart-active"))
    parts.append("<h2>Phases</h2>")
    parts.append(_chart(charts_html.phases(analyses), "chart-phases"))
    parts.append("<h2>Critical samples (finished last) and what they waited on</h2>")
    for a in analyses:
        parts.append(f"<h3>{html.escape(charts_html.label(a))}</h3>" + _table(_critical_table(a)))
    parts += [sections.failed_html(analyses), sections.scores_html(analyses)]
    parts.append("<h2>Per-sample timelines</h2>")
    for i, a in enumerate(analyses):
        parts.append(_chart(charts_html.gantt(a), f"chart-gantt-{i}"))

    pngs = [charts_png.gantt_png(main, out_dir / "gantt.png"),
            charts_png.utilisation_png(main, out_dir / "utilisation.png"),
            charts_png.completion_png(analyses, out_dir / "tail.png"),
            charts_png.phases_png(analyses, out_dir / "phases.png")]
    links = " ".join(f'<a href="{p.name}">{p.name}</a>' for p in pngs)
    parts.append(f"<h2>Static images</h2><p>{links} <a href=\"summary.json\">summary.json</a></p>")

    (out_dir / "summary.json").write_text(_summary_json(summaries))
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head>"
            f"<body>{''.join(parts)}</body></html>")
    index = out_dir / "index.html"
    index.write_text(with_csp(page), encoding="utf-8")  # only the report's own scripts may run
    return index
