"""Batches with conversations, in the request/response formats the runner (tasks/steps.py) and the
gateway (gateway/inference.py, gateway/tools.py) record."""

from __future__ import annotations

from typing import Any

from dashboards_batches import T0, write_batch

from agentbatch.db.store import Store

LONG = "row " * 1500  # 6,000 characters: folded
HOSTILE = "<script>document.documentElement.setAttribute('data-pwned','transcript')</script>\x1b[31mred"
SYSTEM = {"role": "system", "content": "You are a weather agent."}
USER = {"role": "user", "content": "Weather in Paris?"}


def _call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _step(index: int, kind: str, t: float, **kw: Any) -> dict[str, Any]:
    """A step queued at T0 + t, started 0.5 s later, running 1 s."""
    return dict(index=index, kind=kind, enq=T0 + t, start=T0 + t + 0.5, fin=T0 + t + 1.5,
                worker="w0" if kind == "inference" else "slot-0", **kw)


def runner_samples() -> list[dict[str, Any]]:
    """Sample 0 completes after a retried tool call with a long observation; sample 1 fails after a
    tool call whose observation is hostile markup and a terminal escape."""
    ok = [
        _step(0, "inference", 0, prompt=120, cached=0, output=20,
              request={"n_messages": 2, "priority": 0, "messages": [SYSTEM, USER], "tools": []},
              response={"message": {"role": "assistant", "content": None,
                                    "tool_calls": [_call("get_weather", '{"city": "Paris"}', "c1")]},
                        "finish_reason": "tool_calls"}),
        _step(1, "environment", 2, status="failed", error="EnvironmentFailure: sandbox timed out",
              request={"from_step": 0}),
        _step(1, "environment", 4, attempt=2, request={"from_step": 0},
              response={"messages": [{"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C " + LONG}],
                        "done": False}),
        _step(2, "inference", 6, prompt=6200, cached=120, output=8, request={"n_messages": 4, "priority": 1},
              response={"message": {"role": "assistant", "content": "It is sunny in Paris."},
                        "finish_reason": "stop"}),
    ]
    bad = [
        _step(0, "inference", 0, prompt=100, cached=0, output=15,
              request={"n_messages": 1, "priority": 0, "messages": [{"role": "user", "content": "Clean up."}]},
              response={"message": {"role": "assistant", "content": "",
                                    "tool_calls": [_call("rm_rf", '{"path": "/tmp/x"}', "c9")]}}),
        _step(1, "environment", 2, request={"from_step": 0},
              response={"messages": [{"role": "tool", "tool_call_id": "c9", "content": HOSTILE}], "done": True}),
    ]
    return [
        dict(task_id="weather", group="tools", admitted=T0, finished=T0 + 8, status="completed", score=1.0,
             result={"score": 1.0, "valid": True, "checker": "exact"}, steps=ok),
        dict(task_id="cleanup", group="shell", admitted=T0, finished=T0 + 4, status="failed", score=None,
             error="ScoringError: checker crashed", steps=bad),
    ]


def gateway_samples() -> list[dict[str, Any]]:
    """A harness through both gateways: its second request repeats the first answer and the tool
    result the MCP tool gateway already recorded, and adds a new user turn."""
    first = {"role": "assistant", "content": None, "tool_calls": [_call("add", '{"a": 40, "b": 2}', "g1")]}
    steps = [
        _step(0, "inference", 0, prompt=50, cached=0, output=10,
              request={"n_messages": 1, "priority": 0, "messages_from": 0, "messages": [USER]},
              response={"message": first, "finish_reason": "tool_calls", "id": "chatcmpl-1"}),
        _step(1, "environment", 2, request={"calls": [{"name": "add", "server": "calc", "arguments": {"a": 40, "b": 2}}]},
              response={"messages": [{"role": "tool", "content": "42"}], "done": False}),
        _step(2, "inference", 4, prompt=80, cached=50, output=5,
              request={"n_messages": 4, "priority": 1, "messages_from": 1,
                       "messages": [first, {"role": "tool", "tool_call_id": "g1", "content": "42"},
                                    {"role": "user", "content": "Thanks. Twice that?"}]},
              response={"message": {"role": "assistant", "content": "84"}, "finish_reason": "stop",
                        "id": "chatcmpl-2"}),
    ]
    return [dict(task_id="calc", admitted=T0, finished=T0 + 6, status="completed", score=1.0, steps=steps)]


def write_runner(store: Store, **kw: Any) -> int:
    return write_batch(store, runner_samples(), config={"scheduling": {"env_slots": 1}}, workers=("w0",), **kw)
