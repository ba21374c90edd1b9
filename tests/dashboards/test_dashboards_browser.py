"""The written report renders in a real headless Chromium: its script draws every chart, the
screenshot is not blank, the console shows no errors, the sample list filters, and transcripts open.
Needs Debian's chromium (.ci/setup_chromium.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch
from PIL import Image

from agentbatch.dashboards.browser import find_chromium, render, screenshot
from agentbatch.dashboards.report import write_report
from agentbatch.db.store import Store

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.browser,
    pytest.mark.xdist_group("dashboards_browser"),  # one report for the module
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (run .ci/setup_chromium.sh)"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    store = Store(f"sqlite:///{tmp / 'agentbatch.sqlite'}")
    a = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    b = write_batch(store, known_samples(shift=50.0), config=KNOWN_CONFIG, workers=("w0", "w1"), name="b")
    path = write_report(store, [a, b], tmp / "out")
    store.close()
    return path


def test_charts_drawn_without_console_errors(report, tmp_path):
    r = render(report, dump_dom=True)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.dom
    chart_divs = re.findall(r'<div class="chart" id="(chart-[a-z0-9-]+)"', report.read_text())
    assert len(chart_divs) >= 8
    # the script fills each placeholder div with an SVG holding the chart's series
    for chart_id in chart_divs:
        m = re.search(rf'<div class="chart" id="{chart_id}">(.*?)<div class="legend">', dom, re.S)
        assert m and 'class="chart-svg"' in m.group(1) and 'class="series' in m.group(1), chart_id
    assert 'class="series bars"' in dom  # the Gantt and phase bars were drawn
    assert r.console_errors == []


def test_screenshot_not_blank(report, tmp_path):
    shot = tmp_path / "shot.png"
    r = render(report, screenshot=shot)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2400)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables, coloured lines
    # Some pixels carry the chart palette (blue lines/bars), not just black text on white.
    strong = sum(n for n, (r, g, b) in colours if max(r, g, b) - min(r, g, b) > 80)
    assert strong > 500
    assert r.console_errors == []
    assert screenshot(report, tmp_path / "again.png") == tmp_path / "again.png"


def test_console_error_detection_works(tmp_path):
    """Control: a page with a script error is caught by the same check."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefined_function_here();</script></body></html>")
    r = render(bad, dump_dom=True)
    assert any("Uncaught" in line for line in r.console_errors)


def test_report_command_screenshot(tmp_path, capsys):
    from agentbatch.flows.cli import main

    url = f"sqlite:///{tmp_path / 'agentbatch.sqlite'}"
    store = Store(url)
    bid = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    store.close()
    assert main(["report", str(bid), "--out", str(tmp_path / "r"), "--screenshot", "--db", url]) == 0
    shot = tmp_path / "r" / "screenshot.png"
    assert f"screenshot: {shot.resolve()}" in capsys.readouterr().out
    assert Image.open(shot).size == (1400, 2400)


def test_report_explains_the_run(tmp_path):
    """The rendered page shows the config and policies, the config diff against the compared batch,
    the failed sample with its reason, scores per group and per task, and hints."""
    from test_dashboards_sections import CONFIG, mixed_samples

    other = {**CONFIG, "scheduling": {**CONFIG["scheduling"], "router": {"name": "trajectory_aware", "params": {}}}}
    store = Store(f"sqlite:///{tmp_path / 'agentbatch.sqlite'}")
    a = write_batch(store, mixed_samples(), config=CONFIG, workers=("w0", "w1"))
    b = write_batch(store, known_samples(shift=50.0), config=other, workers=("w0", "w1"), name="b")
    page = write_report(store, [a, b], tmp_path / "out")
    store.close()

    r = render(page, dump_dom=True)
    assert r.returncode == 0 and r.console_errors == [], r.stderr[-2000:]
    dom = r.dom

    def section(section_id: str) -> str:
        m = re.search(rf'<section id="{section_id}">(.*?)</section>', dom, re.S)
        assert m, f"section {section_id} missing"
        return m.group(1)

    config = section("config")
    assert re.search(r"<th>router</th>\s*<td>round_robin</td>\s*<td>trajectory_aware</td>", config)
    assert re.search(r'id="config-diff".*scheduling\.router\.name', config, re.S)
    failed = section("failed-samples")
    assert re.search(r"<td>t1</td>.*EnvironmentError: sandbox start failed after 3 attempts", failed, re.S)
    scores = section("scores")
    assert re.search(r"<th>base</th>\s*<td>2</td>\s*<td>1</td>\s*<td>1</td>\s*<td>1</td>", scores)  # group row
    assert re.search(r"<th>miss_func</th>\s*<td>2</td>\s*<td>2</td>\s*<td>0</td>\s*<td>1</td>", scores)
    assert f'id="tasks-{a}"' in scores and f'id="groups-{a}"' in scores
    assert "<li>" in section("hints")
    assert "run-to-run spread" in dom  # the comparison text
