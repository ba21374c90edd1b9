"""Comparison of batches and the written report files."""

from __future__ import annotations

import json
import re

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch
from PIL import Image

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.compare import check_scores, compare
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.report import write_report
from agentbatch.db.store import UnknownBatch


def _two(store, scores_b=(1.0, 0.0, 1.0, 1.0), shift=30.0):
    a = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    # Same tasks, every time stretched: makespan 14 -> 28 when shifted and slowed by 2x.
    slow = known_samples(scores_b)
    for x in slow:
        x["admitted"] = 1000 + 2 * (x["admitted"] - 1000) + shift
        x["finished"] = 1000 + 2 * (x["finished"] - 1000) + shift
        for st in x["steps"]:
            for k in ("enq", "start", "fin"):
                st[k] = 1000 + 2 * (st[k] - 1000) + shift
            for k in ("prefill", "decode", "eq"):
                if st.get(k) is not None:
                    st[k] *= 2
    b = write_batch(store, slow, config=KNOWN_CONFIG, workers=("w0", "w1"), name="slow")
    return a, b


def test_compare_ratios_and_scores(store):
    a, b = _two(store)
    cmp = compare([BatchAnalysis(load_batch(store, x)) for x in (a, b)])
    fig = cmp.figures
    assert fig.loc["makespan_s", f"batch {a}"] == pytest.approx(14.0)
    assert fig.loc["makespan_s", f"batch {b}"] == pytest.approx(28.0)
    assert fig.loc["makespan_s", f"ratio {b}"] == pytest.approx(2.0)
    assert fig.loc["lower_bound_s", f"ratio {b}"] == pytest.approx(2.0)
    assert fig.loc["makespan_over_lb", f"ratio {b}"] == pytest.approx(1.0)
    assert cmp.scores.agree and cmp.scores.tasks_compared == 4
    assert "scores agree on 4 task ids" in cmp.to_text()


def test_score_mismatch_and_missing(store):
    a, b = _two(store, scores_b=(1.0, 1.0, 1.0, 1.0))
    c = write_batch(store, known_samples()[:3], config=KNOWN_CONFIG)
    check = check_scores([BatchAnalysis(load_batch(store, x)) for x in (a, b, c)])
    assert not check.agree
    assert check.mismatched == ["t1"]
    assert check.missing == ["t3"]


def test_write_report_files(store, tmp_path):
    a, b = _two(store)
    index = write_report(store, [a, b], tmp_path / "rep")
    assert index == tmp_path / "rep" / "index.html"
    page = index.read_text()
    # Self-contained and light: the page's own script and its data, no chart library, nothing external.
    assert "Plotly" not in page and len(page) < 100_000
    assert not re.search(r'<script[^>]+src=', page)
    assert not re.search(r'<link[^>]+href="https?:', page)
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)[1])
    specs = {c["id"]: c for c in data["charts"]}
    for chart in ("chart-completion", "chart-latency", "chart-utilisation-0", "chart-utilisation-1",
                  "chart-active", "chart-phases", "chart-gantt-0", "chart-gantt-1", "chart-env-compare"):
        assert f'id="{chart}"' in page and chart in specs
    # the completion curve of batch a: (0, 0), then its four finish times (s from t0) and fractions
    done = specs["chart-completion"]["series"][0]
    assert done["x"] == [0, 1, 8.5, 12, 14] and done["y"] == [0, 0.25, 0.5, 0.75, 1]
    # the sample list: one column per field, four samples per batch, each with its transcript page
    first = data["samples"][0]
    assert first["cols"]["task"] == ["t0", "t1", "t2", "t3"] and first["cols"]["retries"] == [0, 1, 0, 0]
    for sid in first["cols"]["id"]:
        assert (index.parent / f"{first['pages']}{sid}.html").is_file()
    assert "Scores agree" in page
    for png in ("gantt.png", "utilisation.png", "tail.png", "phases.png"):
        img = Image.open(index.parent / png).convert("RGB")
        assert img.size[0] > 400
        assert len(img.getcolors(maxcolors=1 << 20)) > 20  # not blank
    rows = json.loads((index.parent / "summary.json").read_text())
    assert [r["makespan_s"] for r in rows] == pytest.approx([14.0, 28.0])


def test_report_unknown_batch(store, tmp_path):
    a = write_batch(store, known_samples(), config=KNOWN_CONFIG)
    with pytest.raises(UnknownBatch):
        write_report(store, [a, 999], tmp_path / "x")
