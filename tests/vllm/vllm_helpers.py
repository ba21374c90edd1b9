"""Shared bits of the vllm tests: free ports, configs for the fake server, process checks."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from agentbatch.engines.vllm_workers import WorkersConfig

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
TINY_MODEL = REPO / ".cache" / "tiny-llama"
# Written by .ci/setup_vllm.sh only after vLLM imported: a half-built venv does not count.
VLLM_READY = REPO / ".venv-vllm" / "agentbatch-setup.json"


def vllm_skip_reason(model: Path = TINY_MODEL) -> str | None:
    if not VLLM_PYTHON.exists() or not VLLM_READY.exists():
        return f"vLLM is not installed in {VLLM_PYTHON.parent.parent} (run .ci/setup_vllm.sh)"
    if not (model / "config.json").exists():
        return f"no tiny model at {model} (run .ci/setup_vllm.sh)"
    return None


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def fake_config(tmp_path: Path, count: int = 1, env: dict[str, str] | None = None, **kw: Any) -> WorkersConfig:
    """Workers config that runs tests/vllm/vllm_fake_server.py instead of vLLM."""
    ports = free_ports(count)
    data: dict[str, Any] = {
        "model": "fake-model", "python": sys.executable, "entrypoint": "vllm_fake_server", "count": count,
        "device": "cpu", "log_dir": str(tmp_path / "logs"), "endpoints_file": str(tmp_path / "endpoints.json"),
        "startup_timeout_s": 20, "stop_timeout_s": 3,
        "workers": [{"port": p} for p in ports],
        "settings": {"env": {"PYTHONPATH": str(HERE), **(env or {})}},
    }
    data.update(kw)
    return WorkersConfig.model_validate(data)


def processes_with(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line contains `marker`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            out.append((int(entry.name), cmd))
    return out
