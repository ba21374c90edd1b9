"""The written report renders in a real headless Chromium: plotly draws every chart, the screenshot
is not blank and the console shows no errors. Needs Debian's chromium (.ci/setup_chromium.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch
from PIL import Image

from agentbatch.dashboards.report import write_report
from agentbatch.db.store import Store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (run .ci/setup_chromium.sh)"),
]
_CONSOLE_ERROR = re.compile(r"CONSOLE.*(Uncaught|Error|error)|ERROR:CONSOLE")


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000",
           "--window-size=1400,2400", *extra, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if _CONSOLE_ERROR.search(line)]


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
    proc = _chromium(report, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    chart_divs = re.findall(r'<div id="(chart-[a-z0-9-]+)"', report.read_text())
    assert len(chart_divs) >= 8
    # plotly replaces each placeholder div with a plot container holding its main svg.
    assert dom.count('class="main-svg"') >= len(chart_divs)
    assert dom.count("plot-container") >= len(chart_divs)
    assert 'class="bars"' in dom or "trace bars" in dom  # the Gantt and phase bars were drawn
    assert _console_errors(proc.stderr) == []


def test_screenshot_not_blank(report, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _chromium(report, tmp_path / "profile", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2400)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables, coloured lines
    # Some pixels carry the chart palette (blue lines/bars), not just black text on white.
    strong = sum(n for n, (r, g, b) in colours if max(r, g, b) - min(r, g, b) > 80)
    assert strong > 500
    assert _console_errors(proc.stderr) == []


def test_console_error_detection_works(tmp_path):
    """Control: a page with a script error is caught by the same check."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefined_function_here();</script></body></html>")
    proc = _chromium(bad, tmp_path / "profile", "--dump-dom")
    assert any("Uncaught" in line for line in _console_errors(proc.stderr))
