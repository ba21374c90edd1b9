"""The mcp workload on a server we did not write (tests/plugins/kv_server.py, plain MCP SDK): tasks
from a JSONL file with a field mapping, a scorer plugin, a per-sample isolation key injected into
every call, tools hidden by pattern, per-call latency recorded; through the Python API and the flow."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import agentbatch
from agentbatch.environments.registry import make_workload

HERE = Path(__file__).resolve().parent


def write_tasks(path: Path) -> None:
    rows = []
    for i, (key, value, suite) in enumerate([("color", "blue", "colors"), ("color", "red", "colors"),
                                             ("pet", "cat", "animals")]):
        rows.append({
            "task_id": f"kv-{i}", "suite": suite,
            "scenario": {"asks": [f"Save {value!r} under {key!r}.", f"What is under {key!r}?"]},
            "solution": [{"calls": [{"name": "kv_set", "arguments": {"key": key, "value": value}}], "final_text": "saved"},
                         {"calls": [{"name": "kv_get", "arguments": {"key": key}}], "final_text": value}],
            "expected": {key: value},
        })
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def params(tasks: Path) -> dict:
    return {
        "servers": [{"name": "kv", "command": sys.executable, "args": [str(HERE / "kv_server.py")]}],
        "task_file": {"path": str(tasks), "fields": {"id": "task_id", "turns": "scenario.asks", "group": "suite",
                                                      "ground_truth": "solution"}},
        "inject": {"state_key": "{sample_key}"}, "tools_hide": ["debug_*"], "state_tool": "debug_dump",
        "scorer": "kv_scoring:score", "restore_mode": "external", "batch_label": "t",
    }


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # the scorer plugin's module


@pytest.mark.usefixtures("on_path")
def test_schema_injection_and_hidden_tools(tmp_path: Path) -> None:
    write_tasks(tmp_path / "tasks.jsonl")
    wl = make_workload("mcp", params(tmp_path / "tasks.jsonl"))
    tasks = wl.tasks()
    assert [(t.task_id, t.group) for t in tasks] == [("kv-0", "colors"), ("kv-1", "colors"), ("kv-2", "animals")]

    async def main() -> tuple[list, list, dict]:
        env = wl.create(tasks[0])
        try:
            reset = await env.reset(tasks[0])
            peek = {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "debug_dump", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "kv_set",
                                                              "arguments": '{"key": "color", "value": "blue"}'}}]}
            res = await env.step(peek)
            return reset.tools, res.messages, env.injected
        finally:
            await env.close()
            await wl.aclose()

    tools, messages, injected = asyncio.run(main())
    assert sorted(t["function"]["name"] for t in tools) == ["kv_get", "kv_set"]  # debug_* hidden
    assert all("state_key" not in t["function"]["parameters"]["properties"] for t in tools)
    assert messages[0]["content"].startswith("error: unknown tool") and messages[1]["content"] == "ok"
    assert injected == {"state_key": "t:kv-0"}


@pytest.mark.usefixtures("on_path")
def test_limit_and_ids_select_tasks_and_the_servers_fit_the_settings(tmp_path: Path) -> None:
    write_tasks(tmp_path / "tasks.jsonl")
    assert [t.task_id for t in make_workload("mcp", {**params(tmp_path / "tasks.jsonl"), "limit": 2}).tasks()] \
        == ["kv-0", "kv-1"]
    wl = make_workload("mcp", {**params(tmp_path / "tasks.jsonl"), "ids": ["kv-2", "kv-0"]})
    assert [t.task_id for t in wl.tasks()] == ["kv-0", "kv-2"]
    wl.check()  # the real server's tools: tools_hide, state_tool and the injected state_key all fit


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api", "on_path")
def test_third_party_server_batch_scores_by_plugin_per_group(tmp_path: Path) -> None:
    write_tasks(tmp_path / "tasks.jsonl")
    result = agentbatch.run(name="kv", workload="mcp", workload_params=params(tmp_path / "tasks.jsonl"),
                            engine="scripted", db=f"sqlite:///{tmp_path / 'kv.sqlite'}")
    assert result.status == "completed" and result.score_mean == 1.0
    assert result.group_scores == {"animals": 1.0, "colors": 1.0}
    for s in result.samples:  # two samples wrote "color" to one shared server: isolated by state_key
        assert s.result["state_ok"] and s.result["calls"] == 2
        assert len(s.result["tool_latency_s"]) == 2 and all(x > 0 for x in s.result["tool_latency_s"])
