"""A scorer plugin for the kv benchmark (tests): the final state and the final answer must match."""

from __future__ import annotations

from agentbatch.environments.mcp_tasks import ScoreInput


def score(inp: ScoreInput) -> dict:
    expected = inp.task.data["record"]["expected"]
    state_ok = inp.state == expected
    answer_ok = inp.final_text == next(iter(expected.values()))
    return {"score": float(state_ok and answer_ok), "state_ok": state_ok, "calls": len(inp.tool_results)}
