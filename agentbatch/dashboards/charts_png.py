"""Static PNG versions of the key charts (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from agentbatch.dashboards.analytics import PHASES, BatchAnalysis  # noqa: E402
from agentbatch.dashboards.charts_html import (  # noqa: E402
    ENV_COLOUR,
    PHASE_COLOURS,
    SEGMENTS,
    UTIL_BINS,
    colour,
    gantt_segments,
    label,
    worker_colour,
)
from agentbatch.dashboards.timeline import binned_average  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gantt_png(a: BatchAnalysis, path: Path) -> Path:
    seg = gantt_segments(a)
    rows = seg.attrs.get("rows", [])
    pos = {r: i for i, r in enumerate(rows)}
    height_in = max(3.0, min(20.0, 0.22 * len(rows) + 1.5))
    fig, ax = plt.subplots(figsize=(11, height_in))
    # Thick horizontal lines (one LineCollection per segment kind), not one Rectangle per bar:
    # thousands of barh patches take tens of seconds to draw.
    lw = max(0.5, min(12.0, 0.8 * 0.75 * height_in * 72 / max(len(rows), 1)))
    for name, seg_colour in SEGMENTS.items():
        s = seg[seg["segment"] == name]
        if not s.empty:
            ax.hlines([pos[r] for r in s["row"]], s["start"], s["start"] + s["duration"], colors=seg_colour,
                      label=name, linewidth=lw, capstyle="butt")
    ax.set_ylim(-1, max(len(rows), 1))
    if len(rows) <= 60:
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("seconds from t0")
    ax.set_ylabel("sample")
    ax.set_title(f"Per-sample timeline, {label(a)}")
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def utilisation_png(a: BatchAnalysis, path: Path) -> Path:
    t0, t1 = a.t0 or 0.0, a.t_end or 0.0
    cap = a.capacity
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for i, (w, c) in enumerate(sorted(a.worker_curves.items())):
        b = binned_average(c, t0, t1, UTIL_BINS)
        ax1.step(b["t"] - t0, b["level"] / cap.per_worker_inflight, where="post", label=f"worker {w}",
                 color=worker_colour(i))
    b = binned_average(a.env_curve, t0, t1, UTIL_BINS)
    ax1.step(b["t"] - t0, b["level"] / cap.env_slots, where="post", label="environment slots", color=ENV_COLOUR,
             linewidth=2)
    ax1.set_ylabel("fraction of capacity (bin mean)")
    ax1.set_title(f"Utilisation, {label(a)}")
    ax1.legend(fontsize=8)
    c = a.active_curve
    ax2.step(c["t"] - t0, c["level"], where="post", color="#31a354")
    ax2.set_ylabel("active samples")
    ax2.set_xlabel("seconds from t0")
    return _save(fig, path)


def completion_png(analyses: list[BatchAnalysis], path: Path) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, a in enumerate(analyses):
        f = np.sort(a.samples["finished_at"].dropna().to_numpy()) - (a.t0 or 0.0)
        ax1.step(np.append(0.0, f), np.arange(0, len(f) + 1) / max(len(a.samples), 1), where="post", label=label(a),
                 color=colour(i))
        lat = a.latency.to_numpy()
        ax2.step(np.append(lat[:1], lat), np.arange(0, len(lat) + 1) / max(len(lat), 1), where="post",
                 label=label(a), color=colour(i))
    ax1.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    ax1.axhline(0.99, color="grey", linestyle=":", linewidth=1)
    ax1.set_title("Samples done over time (tail)")
    ax1.set_xlabel("seconds from t0")
    ax2.set_title("Latency CDF")
    ax2.set_xlabel("seconds")
    ax1.legend(fontsize=8)
    return _save(fig, path)


def phases_png(analyses: list[BatchAnalysis], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(5.0, 2.2 * len(analyses) + 3), 4))
    names = [a.data.title for a in analyses]
    bottom = np.zeros(len(analyses))
    for p in PHASES:
        vals = np.array([a.phases[p] for a in analyses])
        ax.bar(names, vals, bottom=bottom, label=p, color=PHASE_COLOURS[p])
        bottom += vals
    ax.set_ylabel("sample-seconds")
    ax.set_title("Where sample time went")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    return _save(fig, path)
