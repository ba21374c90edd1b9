"""Occupancy curves: how many intervals are open at each moment (in-flight requests, busy slots,
active samples), as right-continuous step functions."""

from __future__ import annotations

import numpy as np
import pandas as pd


def occupancy(starts: np.ndarray | pd.Series, ends: np.ndarray | pd.Series) -> pd.DataFrame:
    """Step curve of open intervals [start, end): columns t (change points) and level (count from t on).

    Intervals with a missing or inverted end are dropped (an abandoned step has no known end)."""
    s = np.asarray(starts, dtype="float64")
    e = np.asarray(ends, dtype="float64")
    ok = np.isfinite(s) & np.isfinite(e) & (e >= s)
    s, e = s[ok], e[ok]
    if s.size == 0:
        return pd.DataFrame({"t": np.array([], dtype="float64"), "level": np.array([], dtype="int64")})
    times = np.concatenate([s, e])
    deltas = np.concatenate([np.ones_like(s, dtype="int64"), -np.ones_like(e, dtype="int64")])
    df = pd.DataFrame({"t": times, "d": deltas}).groupby("t", sort=True)["d"].sum()
    level = df.cumsum()
    return pd.DataFrame({"t": df.index.to_numpy(dtype="float64"), "level": level.to_numpy(dtype="int64")})


def time_average(curve: pd.DataFrame, t0: float, t1: float) -> float:
    """Time-weighted mean level over [t0, t1] (0 before the first change point)."""
    if t1 <= t0 or curve.empty:
        return 0.0
    t = curve["t"].to_numpy()
    lv = curve["level"].to_numpy(dtype="float64")
    # Level holding on each segment [t_i, t_{i+1}), clipped to the window.
    seg_start = np.clip(t, t0, t1)
    seg_end = np.clip(np.append(t[1:], t1), t0, t1)
    area = float(np.sum(lv * (seg_end - seg_start)))
    return area / (t1 - t0)


def peak(curve: pd.DataFrame) -> int:
    return int(curve["level"].max()) if not curve.empty else 0


def binned_average(curve: pd.DataFrame, t0: float, t1: float, bins: int = 100) -> pd.DataFrame:
    """Mean level in each of `bins` equal windows of [t0, t1] (columns t = window start, level):
    readable where a raw curve changes thousands of times."""
    edges = np.linspace(t0, t1, bins + 1) if t1 > t0 else np.array([t0, t0])
    if curve.empty or t1 <= t0:
        return pd.DataFrame({"t": edges[:-1], "level": np.zeros(len(edges) - 1)})
    t = curve["t"].to_numpy()
    lv = curve["level"].to_numpy(dtype="float64")
    cum = np.concatenate([[0.0], np.cumsum(lv[:-1] * np.diff(t))])  # area up to each change point
    k = np.searchsorted(t, edges, side="right") - 1
    area = np.where(k < 0, 0.0, cum[np.clip(k, 0, None)] + lv[np.clip(k, 0, None)] * (edges - t[np.clip(k, 0, None)]))
    return pd.DataFrame({"t": edges[:-1], "level": np.diff(area) / np.diff(edges)})


def binned_peak(curve: pd.DataFrame, t0: float, t1: float, bins: int = 100) -> pd.DataFrame:
    """Highest level in each of `bins` equal windows of [t0, t1] (columns t = window start, level):
    the peaks a mean per window smooths away, in a bounded number of points."""
    edges = np.linspace(t0, t1, bins + 1) if t1 > t0 else np.array([t0, t0])
    if curve.empty or t1 <= t0:
        return pd.DataFrame({"t": edges[:-1], "level": np.zeros(len(edges) - 1)})
    t = curve["t"].to_numpy()
    lv = curve["level"].to_numpy(dtype="float64")
    k = np.searchsorted(t, edges[:-1], side="right") - 1
    level = np.where(k < 0, 0.0, lv[np.clip(k, 0, None)])  # the level each window starts at
    first, last = np.searchsorted(t, edges[:-1], side="left"), np.searchsorted(t, edges[1:], side="left")
    for i in np.nonzero(last > first)[0]:  # windows with changes inside
        level[i] = max(level[i], lv[first[i]:last[i]].max())
    return pd.DataFrame({"t": edges[:-1], "level": level})
