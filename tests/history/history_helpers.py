"""Configs and the test engine's registration shared by the history tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
# Two BFCL groups, two tasks each; the test engine answers the two miss_param tasks wrongly.
TASKS = ["multi_turn_base_77", "multi_turn_miss_param_78", "multi_turn_base_89", "multi_turn_miss_param_86"]
WRONG = ["multi_turn_miss_param_78", "multi_turn_miss_param_86"]
NO_WAIT = {"kind": "token", "scale": 0}
WRONG_ENGINE_OBJECT = "wrong_engine:build_wrong_workers"


def config(engine: dict[str, Any] | None = None, name: str = "nightly") -> dict[str, Any]:
    return {
        "name": name,
        "workload": {"kind": "bfcl", "params": {"task_ids": TASKS}},
        "engine": engine or {"kind": "scripted", "params": {"timing": NO_WAIT}},
        "scheduling": {"max_active_samples": 4, "env_slots": 4},
        "execution": {"mode": "lean"},
    }


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def wrong_engine(monkeypatch: Any) -> dict[str, Any]:
    """The test engine, named in the config by the "module:Object" kind form (this folder importable)."""
    monkeypatch.syspath_prepend(str(HERE))
    return {"kind": WRONG_ENGINE_OBJECT, "params": {"timing": NO_WAIT, "wrong_tasks": WRONG}}


def cli(*argv: str) -> int:
    from agentbatch.flows.cli import main

    sys.stdout.flush()
    return main(list(argv))
