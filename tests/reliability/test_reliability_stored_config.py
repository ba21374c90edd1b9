"""What a stored config means does not depend on where it is read: `{sample_key}` is unique across
stores (the same config run into two stores never shares an external server's state), and relative
paths are made absolute when the batch is created (a resume from another folder reads the same task
file and starts the servers in the same folder)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from agentbatch.db.store import Store
from agentbatch.environments.registry import make_workload
from agentbatch.flows.batch import create_batch, plan_batch
from agentbatch.flows.config import validate_config

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def mcp_config(task_path: str, server_args: list[str]) -> dict:
    return {"name": "kv", "workload": {"kind": "mcp", "params": {
        "servers": [{"name": "kv", "command": sys.executable, "args": server_args}],
        "task_file": {"path": task_path, "fields": {"id": "task_id", "turns": "asks"}},
        "inject": {"state_key": "{sample_key}"}, "tools_hide": ["debug_*"], "state_tool": "debug_dump",
        "restore_mode": "external"}}}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a task file and the server script, given to the config by relative paths."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"kv-{i}", "asks": ["hi"]}) + "\n"
                                                for i in range(2)))
    shutil.copy(PLUGINS / "kv_server.py", folder / "kv_server.py")
    monkeypatch.chdir(folder)
    return folder


def stored_params(store: Store, batch_id: int) -> dict:
    return store.get_batch(batch_id).config["workload"]["params"]


def test_sample_key_differs_between_stores_of_the_same_config(project: Path, tmp_path: Path) -> None:
    config = validate_config(mcp_config("tasks.jsonl", ["kv_server.py"]))
    keys = []
    for name in ("a", "b"):
        store = Store(f"sqlite:///{tmp_path / f'{name}.sqlite'}")
        batch_id = create_batch(config, store)  # batch 1 in each store
        params = stored_params(store, batch_id)
        workload = make_workload("mcp", params, batch_id=batch_id)
        keys.append(workload.create(workload.tasks()[0]).injected["state_key"])
        # the same key on resume: it comes from the stored config
        again = make_workload("mcp", stored_params(store, batch_id), batch_id=batch_id)
        assert again.create(again.tasks()[0]).injected["state_key"] == keys[-1]
        store.close()
    assert keys[0] != keys[1], keys  # once both "batch-1:kv-0": the second run wrote into the first's state
    assert all(k.endswith(":kv-0") for k in keys)


def test_relative_paths_are_stored_absolute(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_batch(validate_config(mcp_config("tasks.jsonl", ["kv_server.py"])))
    store = Store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    batch_id = create_batch(plan, store)
    params = stored_params(store, batch_id)
    assert params["task_file"]["path"] == str(project / "tasks.jsonl")
    assert params["servers"][0]["cwd"] == str(project)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a resume from another folder
    workload = make_workload("mcp", params, batch_id=batch_id)
    assert [t.task_id for t in workload.tasks()] == ["kv-0", "kv-1"]
    workload.check()  # the server starts from its folder (its script named relative to it) and lists its tools
    store.close()
