"""Open a written report in headless Chromium: a screenshot, the DOM after the scripts ran, and the
console errors. Used by `agentbatch report --screenshot` and by the browser tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Flags that keep a headless run offline, quiet and independent of any user profile.
BASE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--enable-logging=stderr", "--v=0")
_CONSOLE_ERROR = re.compile(r"CONSOLE.*(Uncaught|Error|error)|ERROR:CONSOLE")


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@dataclass
class Render:
    returncode: int
    dom: str = ""  # with dump_dom
    console_errors: list[str] = field(default_factory=list)
    stderr: str = ""


def render(page: Path, *, screenshot: Path | None = None, dump_dom: bool = False, width: int = 1400,
           height: int = 2400, budget_ms: int | None = 8000, timeout_s: float = 120.0,
           fragment: str = "") -> Render:
    """Load `page` (+ `#fragment`, e.g. the report's sample filter) and take a screenshot or dump the DOM.
    The virtual time budget lets timers run to the end; None: dump as soon as the page has loaded."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install chromium; see .ci/setup_chromium.sh)")
    with tempfile.TemporaryDirectory(prefix="agentbatch-chromium-") as profile:
        cmd = [exe, *BASE_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        if budget_ms is not None:
            cmd.append(f"--virtual-time-budget={budget_ms}")
        if screenshot is not None:
            cmd.append(f"--screenshot={Path(screenshot).resolve()}")
        if dump_dom:
            cmd.append("--dump-dom")
        cmd.append(Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else ""))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    errors = [line for line in proc.stderr.splitlines() if _CONSOLE_ERROR.search(line)]
    return Render(proc.returncode, proc.stdout if dump_dom else "", errors, proc.stderr)


def screenshot(page: Path, out: Path, **kw: Any) -> Path | None:
    """Screenshot of the page, or None when chromium is absent or fails (a report never needs it)."""
    if find_chromium() is None:
        return None
    try:
        r = render(page, screenshot=out, **kw)
    except (OSError, subprocess.SubprocessError):
        return None
    return out if r.returncode == 0 and out.is_file() else None
