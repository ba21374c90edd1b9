"""The sample list and transcripts in a real headless Chromium: the page filtered to failed samples
lists only those, its link opens the transcript, which shows the tool calls and observations and
runs no recorded script. Needs Debian's chromium (.ci/setup_chromium.sh)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch
from transcript_batches import write_runner

from agentbatch.dashboards.browser import find_chromium, render
from agentbatch.dashboards.report import write_report
from agentbatch.db.store import Store

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (run .ci/setup_chromium.sh)"),
]


def rows(dom: str) -> list[list[str]]:
    """The rendered sample table's rows, as cell texts (the link's text for the sample id)."""
    body = re.search(r'<table class="figures" id="sample-table">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert body, "sample table missing"
    out = []
    for tr in re.findall(r'<tr class="sample-row[^"]*">(.*?)</tr>', body.group(1), re.S):
        out.append([html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", tr, re.S)])
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, int, int]:
    tmp = tmp_path_factory.mktemp("samples")
    store = Store(f"sqlite:///{tmp / 'agentbatch.sqlite'}")
    bid = write_runner(store)
    other = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"), name="b")
    failed_id = [s.id for s in store.samples(bid) if s.status == "failed"][0]
    page = write_report(store, [bid, other], tmp / "out")
    store.close()
    return page, bid, failed_id


def test_filter_to_failed_then_open_the_transcript(report):
    page, bid, failed_id = report
    everything = render(page, dump_dom=True)
    assert everything.returncode == 0 and everything.console_errors == [], everything.stderr[-2000:]
    assert [r[2] for r in rows(everything.dom)] == ["weather", "cleanup"]

    filtered = render(page, dump_dom=True, fragment="samples?status=failed")
    assert filtered.console_errors == []
    listed = rows(filtered.dom)
    assert [(r[0], r[2], r[4], r[9]) for r in listed] == [
        (str(failed_id), "cleanup", "failed", "ScoringError: checker crashed")]
    assert "1 of 2 samples match" in filtered.dom
    href = re.search(rf'<a href="([^"]+)">{failed_id}</a>', filtered.dom).group(1)
    assert href == f"samples/b{bid}-s{failed_id}.html"
    # the failed-samples section links the same page
    assert f'<a href="{href}">{failed_id}</a>' in page.read_text()

    transcript = render(page.parent / href, dump_dom=True)
    assert transcript.returncode == 0 and transcript.console_errors == []
    dom = transcript.dom
    assert 'call rm_rf({"path": "/tmp/x"})' in html.unescape(dom)  # the tool call with its arguments
    assert "&lt;script&gt;document.documentElement" in dom  # the observation, shown as text
    assert "data-pwned" not in re.search(r"<html[^>]*>", dom).group(0)  # and not run
    assert "error: ScoringError: checker crashed" in dom


def test_filters_by_group_score_and_duration(report):
    page, _, _ = report
    by_group = rows(render(page, dump_dom=True, fragment="samples?group=tools").dom)
    assert [r[2] for r in by_group] == ["weather"]
    by_score = rows(render(page, dump_dom=True, fragment="samples?smin=0.5").dom)
    assert [r[2] for r in by_score] == ["weather"]  # the failed sample has no score
    by_duration = rows(render(page, dump_dom=True, fragment="samples?dmin=5").dom)
    assert [(r[2], r[6]) for r in by_duration] == [("weather", "8")]
    other = rows(render(page, dump_dom=True, fragment="samples?batch=1&sort=latency").dom)
    assert [r[2] for r in other] == ["t1", "t2", "t0", "t3"]  # latencies 12, 12, 8.5, 1: longest first


def test_transcript_folds_long_observations(report):
    page, bid, failed_id = report
    ok_page = next(p for p in (page.parent / "samples").glob(f"b{bid}-s*.html") if not p.name.endswith(
        f"-s{failed_id}.html"))
    dom = render(ok_page, dump_dom=True).dom
    assert 'call get_weather({"city": "Paris"})' in html.unescape(dom)
    assert re.search(r"<details><summary>6012 characters \(folded\): <code>sunny, 21 C row row", dom)
    assert re.search(r"</summary><pre>sunny, 21 C (row ){1500}</pre></details>", dom)  # all of it, unfolded
    assert "EnvironmentFailure: sandbox timed out" in dom  # the failed attempt, before its retry
    assert "tokens 6200 in (120 cached), 8 out" in dom
