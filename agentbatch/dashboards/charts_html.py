"""The report's interactive charts as compact specs (times in seconds from each batch's t0): plain
dicts of rounded numbers that the page's own small script (report.js) draws as SVG. No chart
library is shipped: a 10,000-sample report stays a few MB and draws in well under a second."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from agentbatch.dashboards.analytics import PHASES, BatchAnalysis
from agentbatch.dashboards.timeline import binned_average, binned_peak

# Bars of a Gantt chart: label, colour. Queues are pale versions of the work they wait for.
SEGMENTS = {
    "inference queue": "#c6dbef",
    "inference": "#2171b5",
    "environment queue": "#fdd0a2",
    "environment": "#e6550d",
    "failed attempt": "#cb181d",
}
PHASE_COLOURS = dict(zip(PHASES, ("#c6dbef", "#6baed6", "#2171b5", "#fdd0a2", "#e6550d", "#cb181d", "#969696"),
                         strict=True))
GANTT_MAX_SAMPLES = 300  # beyond this the chart shows the samples that finished last
UTIL_BINS = 120  # utilisation is shown as the mean over each 1/120 of the makespan
PEAK_BINS = 1000  # the peak curves (hidden by default) have at most this many points
Chart = dict[str, Any]


# One colour per batch (or per worker), the same in every chart of the page.
PALETTE = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F", "#BCBD22",
           "#17BECF")  # plotly's D3 colours


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# Engine workers: no orange or red, those mean environment and failures on this page.
WORKER_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
ENV_COLOUR = "#e6550d"


def worker_colour(i: int) -> str:
    return WORKER_PALETTE[i % len(WORKER_PALETTE)]


def label(a: BatchAnalysis) -> str:
    return f"{a.data.title} ({a.data.name})"


def gantt_segments(a: BatchAnalysis, max_samples: int = GANTT_MAX_SAMPLES) -> pd.DataFrame:
    """One row per bar: sample row label, segment kind, start and duration (s from t0)."""
    t0 = a.t0 or 0.0
    ps = a.per_sample
    order = ps.sort_values(["finished_at", "admitted_at"], na_position="last")
    if len(order) > max_samples:
        order = order.sort_values("finished_at", ascending=False, na_position="first").head(max_samples)
        order = order.sort_values("finished_at", na_position="last")
    index = a.samples.set_index("id")["index"]
    rows = {sid: f"{index[sid]}:{task}" for sid, task in zip(order.index, order["task_id"], strict=True)}
    st = a.steps[a.steps["sample_id"].isin(rows.keys())]
    end = st["finished_at"].fillna(a.t_end if a.t_end is not None else np.nan)
    out = []
    for kind, qname in (("inference", "inference queue"), ("environment", "environment queue")):
        ok = (st["kind"] == kind) & (st["status"] == "completed")
        s = st[ok]
        out.append(pd.DataFrame({"sample_id": s["sample_id"], "segment": qname, "start": s["enqueued_at"] - t0,
                                 "duration": (s["started_at"] - s["enqueued_at"]).clip(lower=0)}))
        out.append(pd.DataFrame({"sample_id": s["sample_id"], "segment": kind, "start": s["started_at"] - t0,
                                 "duration": (end[ok] - s["started_at"]).clip(lower=0)}))
    bad = st[st["status"] != "completed"]
    out.append(pd.DataFrame({"sample_id": bad["sample_id"], "segment": "failed attempt",
                             "start": bad["started_at"] - t0,
                             "duration": (end[bad.index] - bad["started_at"]).clip(lower=0)}))
    seg = pd.concat(out, ignore_index=True)
    seg["row"] = seg["sample_id"].map(rows)
    seg = seg.dropna(subset=["start", "duration"])
    seg.attrs["rows"] = list(rows.values())
    seg.attrs["truncated"] = len(ps) > max_samples
    return seg


def nums(values: Any, digits: int = 3) -> list[float | None]:
    """Rounded numbers for the page's JSON (NaN as null): milliseconds are plenty for a chart."""
    arr = np.round(np.asarray(values, dtype="float64"), digits)
    return [None if np.isnan(v) else (int(v) if v == int(v) else float(v)) for v in arr.tolist()]


def line(x: Any, y: Any, name: str, color: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "color": color, "x": nums(x), "y": nums(y, 4), **kw}


def chart(chart_id: str, title: str, kind: str, series: list[dict[str, Any]], **kw: Any) -> Chart:
    return {"id": chart_id, "title": title, "kind": kind, "series": series, **kw}


def gantt(a: BatchAnalysis, chart_id: str) -> Chart:
    seg = gantt_segments(a)
    rows: list[str] = seg.attrs.get("rows", [])
    pos = {r: i for i, r in enumerate(rows)}
    series = []
    for name, col in SEGMENTS.items():
        s = seg[seg["segment"] == name]
        if not s.empty:
            series.append({"name": name, "color": col, "row": [pos[r] for r in s["row"]], "x": nums(s["start"]),
                           "w": nums(s["duration"])})
    note = f" (the {GANTT_MAX_SAMPLES} samples that finished last)" if seg.attrs.get("truncated") else ""
    return chart(chart_id, f"Per-sample timeline, {label(a)}{note}", "gantt", series, rows=rows,
                 xlabel="seconds from t0", ylabel="sample", height=max(300, min(1600, 14 * len(rows) + 120)))


def utilisation(a: BatchAnalysis, chart_id: str) -> Chart:
    """Mean fraction of capacity in use per time bin; the peak per finer bin is one legend click away."""
    t0, t1 = a.t0 or 0.0, a.t_end or 0.0
    cap = a.capacity
    curves = [(f"worker {w} in-flight / {cap.per_worker_inflight}", c, cap.per_worker_inflight, worker_colour(i), 2)
              for i, (w, c) in enumerate(sorted(a.worker_curves.items()))]
    curves.append((f"environment busy / {cap.env_slots} slots", a.env_curve, cap.env_slots, ENV_COLOUR, 3))
    series = []
    for name, c, denom, col, width in curves:
        b = binned_average(c, t0, t1, UTIL_BINS)
        series.append(line(b["t"] - t0, b["level"] / denom, name, col, step=1, width=width))
        p = binned_peak(c, t0, t1, PEAK_BINS)
        series.append(line(p["t"] - t0, p["level"] / denom, f"{name} (peak)", col, step=1, width=1, hidden=1))
    return chart(chart_id, f"Utilisation over time (mean per bin of {(t1 - t0) / UTIL_BINS:.2g} s), {label(a)}",
                 "line", series, xlabel="seconds from t0", ylabel="fraction of capacity", height=360)


def active_samples(analyses: list[BatchAnalysis]) -> Chart:
    series = [line(a.active_curve["t"] - (a.t0 or 0.0), a.active_curve["level"], label(a), colour(i), step=1)
              for i, a in enumerate(analyses)]
    return chart("chart-active", "Active samples (admitted, not finished)", "line", series,
                 xlabel="seconds from t0", ylabel="samples", height=320)


def env_utilisation_compare(analyses: list[BatchAnalysis]) -> Chart:
    series = []
    for i, a in enumerate(analyses):
        t0, t1 = a.t0 or 0.0, a.t_end or 0.0
        b = binned_average(a.env_curve, t0, t1, UTIL_BINS)
        series.append(line(b["t"] - t0, b["level"] / a.capacity.env_slots, label(a), colour(i), step=1))
    return chart("chart-env-compare", "Environment slots busy (fraction, mean per bin)", "line", series,
                 xlabel="seconds from t0", ylabel="fraction", height=320)


def completion(analyses: list[BatchAnalysis]) -> Chart:
    """Samples done over time, with the 90 % and 99 % points: the tail is the flat end."""
    series = []
    for i, a in enumerate(analyses):
        f = np.sort(a.samples["finished_at"].dropna().to_numpy()) - (a.t0 or 0.0)
        n = max(len(a.samples), 1)
        # Start the curve at (0, 0) so the first finish shows as a step up.
        series.append(line(np.append(0.0, f), np.arange(0, len(f) + 1) / n, label(a), colour(i), step=1))
        points = [(q, a.tail_s(q)) for q in (0.9, 0.99) if len(f)]
        points = [(q, t) for q, t in points if t is not None]
        if points:
            series.append(line([f[-1] - t for _, t in points], [q for q, _ in points],
                               f"{label(a)}: 90 % / 99 % done", colour(i), markers=1))
    return chart("chart-completion", "Samples done over time (tail; x marks 90 % and 99 % done)", "line", series,
                 xlabel="seconds from t0", ylabel="fraction of samples", height=360)


def latency_cdf(analyses: list[BatchAnalysis]) -> Chart:
    series = []
    for i, a in enumerate(analyses):
        lat = a.latency.to_numpy()
        series.append(line(np.append(lat[:1], lat), np.arange(0, len(lat) + 1) / max(len(lat), 1), label(a),
                           colour(i), step=1))
    return chart("chart-latency", "Per-sample latency CDF (admitted to finished)", "line", series,
                 xlabel="seconds", ylabel="fraction of samples", height=320)


def phases(analyses: list[BatchAnalysis]) -> Chart:
    series = [{"name": p, "color": PHASE_COLOURS[p], "y": nums([a.phases[p] for a in analyses])} for p in PHASES]
    if any(a.dead_s for a in analyses):  # a stopped batch's dead time, shown apart from orchestration
        series.append({"name": "dead (stopped)", "color": "#d9d9d9",
                       "y": nums([float(a.per_sample["dead"].sum()) for a in analyses])})
    return chart("chart-phases", "Where sample time went (sample-seconds per phase)", "bars", series,
                 categories=[label(a) for a in analyses], ylabel="sample-seconds", height=360)
