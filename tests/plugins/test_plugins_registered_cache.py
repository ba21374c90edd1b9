"""Entry points are scanned once per state of sys.path (a scan of every installed distribution costs
tens of milliseconds, and a batch resolves its plugins a dozen times), yet a distribution installed
after a lookup is found: on a new sys.path entry, or into a directory already on it."""

from __future__ import annotations

import os

from agentbatch.protocols.plugins import registered


def _dist(where, name: str) -> None:
    dist = where / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[agentbatch.workloads]\n{name} = {name}:Workload\n")


def test_a_distribution_installed_after_a_lookup_is_found(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = registered("workload")
    assert "recorded" in before and "latecomer" not in before
    assert registered("workload") == before  # nothing changed: the same answer
    _dist(site, "latecomer")
    os.utime(site, ns=(1, 1))  # a new mtime even where the clock's granularity is coarse
    assert registered("workload")["latecomer"] == "latecomer:Workload"
    other = tmp_path / "other"
    other.mkdir()
    _dist(other, "elsewhere")
    monkeypatch.syspath_prepend(str(other))
    assert registered("workload")["elsewhere"] == "elsewhere:Workload"
