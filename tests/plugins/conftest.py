"""The example plugin package (examples/plugin_toolbench) installed into the running environment,
as `make install` / CI do; installed here when missing (pip into this interpreter's environment)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugin_toolbench"


@pytest.fixture(scope="session")
def toolbench_installed() -> None:
    if "toolbench" not in {ep.name for ep in entry_points(group="agentbatch.workloads")}:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(EXAMPLE)],
                       check=True, timeout=600)
    assert "toolbench" in {ep.name for ep in entry_points(group="agentbatch.workloads")}
