"""Interactive plotly figures of one or more batches (times in seconds from each batch's t0)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from agentbatch.dashboards.analytics import PHASES, BatchAnalysis
from agentbatch.dashboards.timeline import binned_average

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
_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.15))


# One colour per batch (or per worker), the same in every chart of the page.
PALETTE = qualitative.D3


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# Engine workers: no orange or red, those mean environment and failures on this page.
WORKER_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
ENV_COLOUR = "#e6550d"


def worker_colour(i: int) -> str:
    return WORKER_PALETTE[i % len(WORKER_PALETTE)]


def label(a: BatchAnalysis) -> str:
    return f"batch {a.data.batch_id} ({a.data.name})"


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


def gantt(a: BatchAnalysis) -> go.Figure:
    seg = gantt_segments(a)
    fig = go.Figure()
    for name, colour in SEGMENTS.items():
        s = seg[seg["segment"] == name]
        if s.empty:
            continue
        fig.add_bar(y=s["row"], x=s["duration"], base=s["start"], orientation="h", name=name,
                    marker_color=colour, customdata=np.stack([s["start"], s["duration"]], axis=1),
                    hovertemplate="%{y}<br>" + name + " from %{customdata[0]:.2f} s for %{customdata[1]:.2f} s"
                                  "<extra></extra>")
    rows = seg.attrs.get("rows", [])
    note = f" (the {GANTT_MAX_SAMPLES} samples that finished last)" if seg.attrs.get("truncated") else ""
    fig.update_layout(title=f"Per-sample timeline, {label(a)}{note}", barmode="overlay", xaxis_title="seconds from t0",
                      yaxis=dict(categoryorder="array", categoryarray=rows, title="sample"),
                      height=max(300, min(1600, 18 * len(rows) + 150)), **_LAYOUT)
    return fig


def utilisation(a: BatchAnalysis) -> go.Figure:
    """Mean fraction of capacity in use per time bin; the raw step curves are one legend click away."""
    t0, t1 = a.t0 or 0.0, a.t_end or 0.0
    fig = go.Figure()
    cap = a.capacity
    curves = [(f"worker {w} in-flight / {cap.per_worker_inflight}", c, cap.per_worker_inflight,
               dict(color=worker_colour(i)))
              for i, (w, c) in enumerate(sorted(a.worker_curves.items()))]
    curves.append((f"environment busy / {cap.env_slots} slots", a.env_curve, cap.env_slots,
                   dict(color=ENV_COLOUR, width=3)))
    for name, c, denom, line in curves:
        b = binned_average(c, t0, t1, UTIL_BINS)
        fig.add_scatter(x=b["t"] - t0, y=b["level"] / denom, mode="lines", line_shape="hv", name=name, line=line)
        fig.add_scatter(x=c["t"] - t0, y=c["level"] / denom, mode="lines", line_shape="hv", name=f"{name} (raw)",
                        visible="legendonly", line=dict(width=1, color=line["color"]))
    fig.update_layout(title=f"Utilisation over time (mean per bin of {(t1 - t0) / UTIL_BINS:.2g} s), {label(a)}",
                      xaxis_title="seconds from t0", yaxis_title="fraction of capacity", height=400, **_LAYOUT)
    return fig


def active_samples(analyses: list[BatchAnalysis]) -> go.Figure:
    fig = go.Figure()
    for i, a in enumerate(analyses):
        c = a.active_curve
        fig.add_scatter(x=c["t"] - (a.t0 or 0.0), y=c["level"], mode="lines", line_shape="hv", name=label(a),
                        line=dict(color=colour(i)))
    fig.update_layout(title="Active samples (admitted, not finished)", xaxis_title="seconds from t0",
                      yaxis_title="samples", height=350, **_LAYOUT)
    return fig


def env_utilisation_compare(analyses: list[BatchAnalysis]) -> go.Figure:
    fig = go.Figure()
    for i, a in enumerate(analyses):
        t0, t1 = a.t0 or 0.0, a.t_end or 0.0
        b = binned_average(a.env_curve, t0, t1, UTIL_BINS)
        fig.add_scatter(x=b["t"] - t0, y=b["level"] / a.capacity.env_slots, mode="lines", line_shape="hv",
                        name=label(a), line=dict(color=colour(i)))
    fig.update_layout(title="Environment slots busy (fraction, mean per bin)", xaxis_title="seconds from t0",
                      height=350, **_LAYOUT)
    return fig


def completion(analyses: list[BatchAnalysis]) -> go.Figure:
    """Samples done over time, with the 90 % and 99 % points: the tail is the flat end."""
    fig = go.Figure()
    for i, a in enumerate(analyses):
        f = np.sort(a.samples["finished_at"].dropna().to_numpy()) - (a.t0 or 0.0)
        n = len(a.samples)
        # Start the curve at (0, 0) so the first finish shows as a step up.
        fig.add_scatter(x=np.append(0.0, f), y=np.arange(0, len(f) + 1) / max(n, 1), mode="lines",
                        line_shape="hv", name=label(a), line=dict(color=colour(i)), legendgroup=str(i))
        points = [(q, a.tail_s(q)) for q in (0.9, 0.99) if len(f)]
        points = [(q, t) for q, t in points if t is not None]
        if points:
            fig.add_scatter(x=[f[-1] - t for _, t in points], y=[q for q, _ in points], mode="markers",
                            marker=dict(symbol="x", size=10, color=colour(i)), legendgroup=str(i), showlegend=False,
                            text=[f"{label(a)}: {q:.0%} done; tail {t:.1f} s" for q, t in points],
                            hovertemplate="%{text}<extra></extra>")
    fig.update_layout(title="Samples done over time (tail; x marks 90 % and 99 % done)", xaxis_title="seconds from t0",
                      yaxis_title="fraction of samples", height=380, **_LAYOUT)
    return fig


def latency_cdf(analyses: list[BatchAnalysis]) -> go.Figure:
    fig = go.Figure()
    for i, a in enumerate(analyses):
        lat = a.latency.to_numpy()
        fig.add_scatter(x=np.append(lat[:1], lat), y=np.arange(0, len(lat) + 1) / max(len(lat), 1), mode="lines",
                        line_shape="hv", name=label(a), line=dict(color=colour(i)))
    fig.update_layout(title="Per-sample latency CDF (admitted to finished)", xaxis_title="seconds",
                      yaxis_title="fraction of samples", height=350, **_LAYOUT)
    return fig


def phases(analyses: list[BatchAnalysis]) -> go.Figure:
    fig = go.Figure()
    names = [label(a) for a in analyses]
    for p in PHASES:
        fig.add_bar(x=names, y=[a.phases[p] for a in analyses], name=p, marker_color=PHASE_COLOURS[p])
    fig.update_layout(title="Where sample time went (sample-seconds per phase)", barmode="stack",
                      yaxis_title="sample-seconds", height=380, **_LAYOUT)
    return fig
