"""Shared pieces of the reliability tests: CLI subprocesses, batch configs, step bookkeeping."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from testkit import CLI

from agentbatch.db.store import Store


def bfcl_config(name: str = "reliability", limit: int = 8, scale: float = 1.0, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": name,
        "workload": {"kind": "bfcl", "params": {"limit": limit, "seed": 11}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": scale}}},
        "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 2},
    }
    cfg.update(extra)
    return cfg


def write_config(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli_env(db_url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "AGENTBATCH_DB_URL": db_url, **extra}


def start_cli(args: list[str], db_url: str, **popen: Any) -> subprocess.Popen[str]:
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen}
    return subprocess.Popen([*CLI, *args], env=cli_env(db_url), text=True, **popen)


def run_cli(args: list[str], db_url: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=cli_env(db_url), capture_output=True, text=True, timeout=timeout)


def completions(store: Store, batch_id: int) -> dict[tuple[int, int], list[int]]:
    """(sample id, step index) -> ids of its completed step rows (more than one: done twice)."""
    out: dict[tuple[int, int], list[int]] = {}
    for st in store.steps(batch_id):
        if st.status == "completed":
            out.setdefault((st.sample_id, st.index), []).append(st.id)
    return out


def duplicates(store: Store, batch_id: int) -> dict[tuple[int, int], list[int]]:
    return {k: v for k, v in completions(store, batch_id).items() if len(v) > 1}


# Targets of spawned processes: defined here so that a child imports this light module, not Prefect.
def claim_in_process(url: str, batch_id: int, barrier, out) -> None:  # type: ignore[no-untyped-def]
    from agentbatch.db.leases import SampleLeases

    store = Store(url)
    leases = SampleLeases(store, batch_id, ttl_s=300)
    barrier.wait()
    out.put((leases.owner, [s.id for s in leases.claim(limit=7)]))
    store.close()


def open_store_in_process(url: str, barrier, out) -> None:  # type: ignore[no-untyped-def]
    barrier.wait()
    try:
        Store(url).close()
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{exc.__class__.__name__}: {exc}")
