"""The mcp workload's reconcile hook (`protocols/in_flight.py`): ask the server whether a step ran.

With `reconcile_tool: NAME` (hide it from the model with `tools_hide`), a resume asks the server
about each call of a step a crash cut short: the tool is called once per call with
`{"call": <the server's tool name>, "arguments": {...}}` plus the sample's injected arguments, and
answers JSON `{"ran": true, "result": ...}` (the call took effect; `result`, text or JSON, is the
call's output as the server knows it), `{"ran": false}` (it did not), or anything else (it cannot
tell). Every call ran: the step is recorded with those results and not run again; none ran: it runs
again; otherwise the sample stops for a check. A call that never reaches a server (unknown tool,
arguments that do not parse) counts either way.
"""

from __future__ import annotations

import json
from typing import Any

from agentbatch.environments.docker_env import tool_calls_of
from agentbatch.environments.mcp_client import result_text
from agentbatch.environments.mcp_tasks import decode
from agentbatch.protocols.engine import Message
from agentbatch.protocols.environment import EnvResult
from agentbatch.protocols.in_flight import Reconciled


def _said(text: str, is_error: bool) -> tuple[bool | None, Any]:
    """(ran: True / False / None for cannot tell, the call's result) from the reconcile tool's answer."""
    answer = None if is_error else decode(text)
    if not isinstance(answer, dict) or not isinstance(answer.get("ran"), bool):
        return None, None
    return answer["ran"], answer.get("result")


async def reconcile_step(env: Any, assistant: Message) -> Reconciled:
    """Ask the server, through `env.workload.reconcile_tool`, whether each call of `assistant` ran."""
    tool = env.workload.reconcile_tool
    if tool is None:
        return Reconciled("unknown", detail="the workload has no reconcile_tool")
    toolset = await env.toolset_for_reconcile()
    conn, tool_name = toolset.route[tool]
    answers: list[bool | None] = []
    messages: list[Message] = []
    for call_id, name, args, error in tool_calls_of(assistant):
        target = toolset.route.get(name) if name not in toolset.hidden else None
        if error or target is None:  # never sent: the same error observation either way
            text = f"error: {error}" if error else f"error: unknown tool {name!r}"
            messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": text})
            continue
        res = await conn.call(tool_name, {"call": target[1], "arguments": args or {}, **env.injected})
        ran, result = _said(result_text(res), bool(res.is_error))
        answers.append(ran)
        content = result if isinstance(result, str) else json.dumps(result)
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
    return _verdict(tool, answers, messages)


def _verdict(tool: str, answers: list[bool | None], messages: list[Message]) -> Reconciled:
    """Every call ran: "ran" with their results; none ran: "not_run"; else "unknown"."""
    if all(a is True for a in answers):
        return Reconciled("ran", EnvResult(messages=messages, tool_calls=len(messages)), detail=f"{tool}: every call ran")
    if all(a is False for a in answers):
        return Reconciled("not_run", detail=f"{tool}: no call ran")
    said = ", ".join("ran" if a else "did not run" if a is False else "cannot tell" for a in answers)
    return Reconciled("unknown", detail=f"{tool} answered: {said}")
