"""The batch report, written to a folder: `index.html` (one page: figures, hints, charts, the sample
list with filters), one transcript page per sample under `samples/`, PNG versions of the key charts
and summary.json.

The page carries its data once, as compact JSON (rounded numbers, columns rather than records), and
one small script (report.js) that draws the charts as SVG and the sample list; no chart library is
inlined. Transcript pages are plain HTML that run no script at all.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy.exc import DBAPIError

from agentbatch.dashboards import charts_html, charts_png, sections
from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.compare import Comparison, compare
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.history import history_section_html
from agentbatch.dashboards.inert import with_csp
from agentbatch.dashboards.summary import BatchSummary, summary_from_analysis
from agentbatch.dashboards.transcript import iter_transcripts
from agentbatch.dashboards.transcript_view import page_name, to_html
from agentbatch.db.store import Store

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
pre { background: #f6f6f6; padding: 12px; white-space: pre-wrap; }
table.figures { border-collapse: collapse; font-size: 0.9em; }
table.figures td, table.figures th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
.bad { color: #cb181d; font-weight: bold; } .good { color: #31a354; font-weight: bold; }
.chart { margin: 16px 0; } .chart-title { font-weight: bold; margin: 4px 0; }
.chart-hover { font-size: 0.8em; color: #555; min-height: 1.2em; font-family: monospace; }
.legend { font-size: 0.85em; } .legend-item { margin-right: 14px; cursor: pointer; user-select: none; }
.legend-item.off { opacity: 0.35; }
#sample-filter { margin: 8px 0; font-size: 0.9em; } #sample-filter input { width: 6em; }
#sample-table tr.failed td { color: #cb181d; }
"""
TRANSCRIPT_NOTE = "Each sample id links to its transcript (messages, tool calls, observations, step timings)."


def default_out_dir(batch_id: int) -> Path:
    return Path("reports") / f"batch-{batch_id}"


def _script() -> str:
    return resources.files("agentbatch.dashboards").joinpath("report.js").read_text(encoding="utf-8")


def transcript_href(a: BatchAnalysis, sample_id: int) -> str:
    return page_name(a.data.batch_id, sample_id, _tag(a))


def _tag(a: BatchAnalysis) -> str:
    key = a.data.key
    return key[len(str(a.data.batch_id)):] if key.startswith(str(a.data.batch_id)) else f"-{key}"


def _table(df: pd.DataFrame) -> str:
    return df.to_html(classes="figures", float_format=lambda x: f"{x:.4g}", na_rep="-", border=0)


def _chart(spec: dict[str, Any], charts: list[dict[str, Any]]) -> str:
    """A placeholder the page's script draws the chart into; the spec joins the page's data."""
    charts.append(spec)
    return f'<div class="chart" id="{spec["id"]}"></div>'


def _critical_table(a: BatchAnalysis) -> pd.DataFrame:
    rows = []
    for c in a.critical_samples(10):
        row = {"sample": c.sample_id, "task": c.task_id, "finished_s": c.finished_s, "latency_s": c.latency_s,
               "steps": c.steps, "chain_s": c.chain_s, "waited_on": c.waited_on}
        row.update({f"{k}_s": v for k, v in c.waits.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _summary_json(summaries: list[BatchSummary]) -> str:
    return json.dumps([s.as_json() for s in summaries], indent=1, default=str)


def _comparison_html(cmp: Comparison) -> str:
    ok = cmp.scores.agree
    parts = ["<h2>Comparison (ratios to the first batch)</h2>",
             '<pre id="comparison-text">' + html.escape(cmp.to_text()) + "</pre>", _table(cmp.figures)]
    verdict = "agree" if ok else "DIFFER"
    pairs = "; ".join(p.to_text() for p in cmp.scores.pairs)
    parts.append(f'<p class="{"good" if ok else "bad"}" id="score-verdict">Scores {verdict} per task id '
                 f"({cmp.scores.tasks_compared} task ids). {html.escape(pairs)}.</p>")
    if not ok:
        bad = cmp.scores.table.loc[cmp.scores.mismatched + cmp.scores.missing]
        parts.append(f"<details open><summary>{len(bad)} task ids whose scores differ or are missing</summary>"
                     f"{bad.to_html(classes='figures', float_format=lambda x: f'{x:.4g}', na_rep='-', border=0, table_id='score-diff')}"
                     "</details>")
    return "".join(parts)


def _figures_html(summary: BatchSummary) -> str:
    row = pd.DataFrame([summary.as_row()]).T
    row.columns = [summary.title]
    return "<h2>Figures</h2>" + _table(row)


def _history_html(store: Store, batch_id: int, charts: list[dict[str, Any]]) -> str:
    try:
        body, specs = history_section_html(store, batch_id)
    except DBAPIError as exc:  # e.g. a read-only store without the suite row history wants to write
        return f"<h2>History</h2><p>Not available from this store: {html.escape(str(exc.orig))}</p>"
    charts.extend(specs)
    return body


def sample_data(a: BatchAnalysis, with_pages: bool) -> dict[str, Any]:
    """The sample list's data of one batch, as columns (compact JSON): id, index, task, group (an
    index into `groups`), status, score, latency, steps done, failed attempts, error (failed ones)."""
    sm = a.samples
    ps = a.per_sample.reindex(sm["id"])
    group = sm["task_group"].astype(object).where(sm["task_group"].notna(), "-").astype(str)
    groups = sorted(set(group))
    pos = {g: i for i, g in enumerate(groups)}
    bad = a.steps[a.steps["status"] != "completed"].groupby("sample_id").size()
    error = sm["error"].astype(object).where((sm["status"] == "failed") & sm["error"].notna(), "")
    return {"title": a.data.title, "key": a.data.key, "groups": groups,
            "pages": ("samples/b" + str(a.data.batch_id) + _tag(a) + "-s") if with_pages else None,
            "cols": {"id": sm["id"].astype(int).tolist(), "index": sm["index"].astype(int).tolist(),
                     "task": sm["task_id"].astype(str).tolist(), "group": [pos[g] for g in group],
                     "status": sm["status"].astype(str).tolist(), "score": charts_html.nums(sm["score"], 4),
                     "latency": charts_html.nums(ps["latency_s"].to_numpy()),
                     "steps": sm["steps_done"].fillna(0).astype(int).tolist(),
                     "retries": sm["id"].map(bad).fillna(0).astype(int).tolist(),
                     "error": [str(e)[:160] for e in error]}}


def _samples_html(analyses: list[BatchAnalysis]) -> str:
    sort = ('<select id="f-sort"><option value="">index</option><option value="latency">longest first</option>'
            '<option value="score">lowest score first</option></select>')
    status = ('<select id="f-status"><option value="">all</option><option value="failed">failed</option>'
              '<option value="completed">completed</option></select>')
    form = ('<form id="sample-filter">batch <select id="f-batch"></select> group <select id="f-group">'
            f'<option value="">all</option></select> status {status} score &ge; <input id="f-smin" type="number" '
            'step="any"> &le; <input id="f-smax" type="number" step="any"> duration (s) &ge; <input id="f-dmin" '
            'type="number" step="any"> &le; <input id="f-dmax" type="number" step="any"> task contains '
            f'<input id="f-task" type="text"> sort {sort}</form>')
    head = "".join(f"<th>{h}</th>" for h in ("sample", "index", "task", "group", "status", "score", "latency (s)",
                                             "steps", "failed attempts", "error"))
    return (f'<section id="samples"><h2>Samples</h2><p>{TRANSCRIPT_NOTE} The filter is kept in the address '
            f"(e.g. <code>index.html#samples?status=failed</code>).</p>{form}<p id=\"sample-count\"></p>"
            f'<table class="figures" id="sample-table"><thead><tr>{head}</tr></thead><tbody></tbody></table>'
            "</section>")


def write_transcripts(analyses: list[BatchAnalysis], stores: list[Store | None], out_dir: Path) -> int:
    """One page per sample of every batch with a store; returns how many were written."""
    written = 0
    for a, store in zip(analyses, stores, strict=True):
        if store is None:
            continue
        for t in iter_transcripts(store, a.data.batch_id):
            path = out_dir / transcript_href(a, t.sample_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(to_html(t), encoding="utf-8")
            written += 1
    return written


def write_report(store: Store, batch_ids: list[int], out_dir: Path) -> Path:
    """Write index.html (+ transcripts, PNGs and summary.json) for the first batch, compared with the
    others. Returns the path of index.html. Raises db.store.UnknownBatch for an unknown id."""
    if not batch_ids:
        raise ValueError("write_report needs at least one batch id")
    return write_report_for([BatchAnalysis(load_batch(store, b)) for b in batch_ids], out_dir, store=store)


def _body(analyses: list[BatchAnalysis], summaries: list[BatchSummary], store: Store | None,
          charts: list[dict[str, Any]], linked: bool) -> list[str]:
    main = analyses[0]
    href = transcript_href if linked else None
    parts = ["<h2>Summary</h2>", "<pre>" + html.escape("\n\n".join(s.to_text() for s in summaries)) + "</pre>",
             sections.hints_html(main), sections.config_html(analyses),  # what to change; what ran
             sections.choice_html(analyses),  # why that policy ran (empty without a choice)
             _comparison_html(compare(analyses)) if len(analyses) > 1 else _figures_html(summaries[0])]
    if store is not None:  # score and makespan over the runs of the suite (dashboards/history.py)
        parts.append(_history_html(store, main.data.batch_id, charts))
    parts += ["<h2>Tail and latency</h2>", _chart(charts_html.completion(analyses), charts),
              _chart(charts_html.latency_cdf(analyses), charts), "<h2>Utilisation and active samples</h2>"]
    parts += [_chart(charts_html.utilisation(a, f"chart-utilisation-{i}"), charts) for i, a in enumerate(analyses)]
    if len(analyses) > 1:
        parts.append(_chart(charts_html.env_utilisation_compare(analyses), charts))
    parts += [_chart(charts_html.active_samples(analyses), charts), "<h2>Phases</h2>",
              _chart(charts_html.phases(analyses), charts),
              "<h2>Critical samples (finished last) and what they waited on</h2>"]
    for a in analyses:
        table = _critical_table(a)
        body = (sections.linked_table(table, f"critical-{a.data.key}", "sample", sections.sample_href(href, a))
                if href is not None and not table.empty else _table(table))
        parts.append(f"<h3>{html.escape(charts_html.label(a))}</h3>" + body)
    parts += [sections.failed_html(analyses, href), sections.scores_html(analyses), _samples_html(analyses),
              "<h2>Per-sample timelines</h2>"]
    parts += [_chart(charts_html.gantt(a, f"chart-gantt-{i}"), charts) for i, a in enumerate(analyses)]
    return parts


def page_json(data: dict[str, Any]) -> str:
    """JSON for a <script type="application/json"> block: no "<" at all, so no recorded text can end
    the block or open a comment in it."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def write_report_for(analyses: list[BatchAnalysis], out_dir: Path, store: Store | None = None,
                     stores: Iterable[Store | None] | None = None) -> Path:
    """write_report over batches already loaded (the first is the main one). With the store, also the
    history of the main batch's suite; `stores`: the store each batch's transcripts are read from
    (default: `store` for all; None: no transcript pages)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    main = analyses[0]
    sources = list(stores) if stores is not None else [store] * len(analyses)
    summaries = [summary_from_analysis(a) for a in analyses]
    title = f"agentbatch report: {main.data.title} ({main.data.name})"
    if len(analyses) > 1:
        title += " vs " + ", ".join(a.data.title for a in analyses[1:])
    charts: list[dict[str, Any]] = []
    linked = all(s is not None for s in sources)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Times are seconds from "
             "each batch's first admitted sample (t0). Definitions: docs/dashboards.md. "
             '<a href="#samples">Samples and transcripts</a>.</p>', *_body(analyses, summaries, store, charts, linked)]
    write_transcripts(analyses, sources, out_dir)

    pngs = [charts_png.gantt_png(main, out_dir / "gantt.png"),
            charts_png.utilisation_png(main, out_dir / "utilisation.png"),
            charts_png.completion_png(analyses, out_dir / "tail.png"),
            charts_png.phases_png(analyses, out_dir / "phases.png")]
    links = " ".join(f'<a href="{p.name}">{p.name}</a>' for p in pngs)
    parts.append(f"<h2>Static images</h2><p>{links} <a href=\"summary.json\">summary.json</a></p>")

    (out_dir / "summary.json").write_text(_summary_json(summaries))
    data = {"charts": charts, "samples": [sample_data(a, s is not None) for a, s in zip(analyses, sources, strict=True)]}
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}"
            f'<script type="application/json" id="report-data">{page_json(data)}</script>'
            f"<script>{_script()}</script></body></html>")
    index = out_dir / "index.html"
    index.write_text(with_csp(page), encoding="utf-8")  # only the report's own script may run
    return index
