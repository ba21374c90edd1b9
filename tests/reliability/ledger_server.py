"""A stateful MCP server whose state lives outside the process (a JSON file), for the reliability tests.

`cancel_reservation(reservation, session, idempotency_key?)` refunds a reservation: each call adds a
refund, unless its idempotency key was seen before. `slow_cancel` refunds at once and answers after
`seconds` (a process killed meanwhile leaves the refund done and the step unrecorded). `agentbatch_state(session)` returns the
session's refunds. `slow_refund` refunds at once and answers after `seconds` (a repeat at once), with
no idempotency key and no annotation (a repeat refunds again). `slow_set_status` (annotated `idempotentHint`) sets a
reservation's status, counts its calls, and waits `seconds` only when the status changed (a repeat
answers at once). `slow_notify` (no key, no annotation) counts a notification and answers after
`seconds` (a repeat at once). `agentbatch_reconcile(call, arguments, session)` answers whether a call took effect (the
mcp workload's `reconcile_tool`): for `slow_refund`, ran when the reservation was refunded in the
session (with the refund's result), not when it was not; for anything else it cannot tell.
`--state FILE` is the file; every call reads and writes it (one process at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import mcp_types as types

from agentbatch.environments.mcp_servers._serve import add_transport_args, build_server, serve, text_result

TOOLS = [
    types.Tool(name="cancel_reservation", description="Cancel a reservation and refund it.",
               input_schema={"type": "object", "properties": {
                   "reservation": {"type": "string"}, "session": {"type": "string"},
                   "idempotency_key": {"type": "string"}}, "required": ["reservation"]}),
    types.Tool(name="slow_cancel", description="Refund at once, answer after `seconds` (a slow remote call).",
               input_schema={"type": "object", "properties": {
                   "reservation": {"type": "string"}, "seconds": {"type": "number"}, "session": {"type": "string"},
                   "idempotency_key": {"type": "string"}}, "required": ["reservation"]}),
    types.Tool(name="slow_refund", description="Refund at once, answer after `seconds`; no idempotency key.",
               input_schema={"type": "object", "properties": {
                   "reservation": {"type": "string"}, "seconds": {"type": "number"}, "session": {"type": "string"}},
                   "required": ["reservation"]}),
    types.Tool(name="slow_set_status", description="Set a reservation's status (the same call twice: the same state).",
               input_schema={"type": "object", "properties": {
                   "reservation": {"type": "string"}, "status": {"type": "string"}, "seconds": {"type": "number"},
                   "session": {"type": "string"}}, "required": ["reservation", "status"]},
               annotations=types.ToolAnnotations(idempotent_hint=True)),
    types.Tool(name="slow_notify", description="Send a notification, answer after `seconds`; no idempotency key.",
               input_schema={"type": "object", "properties": {
                   "reservation": {"type": "string"}, "seconds": {"type": "number"}, "session": {"type": "string"}},
                   "required": ["reservation"]}),
    types.Tool(name="agentbatch_reconcile", description="Did a call take effect? (agentbatch's reconcile hook)",
               input_schema={"type": "object", "properties": {
                   "call": {"type": "string"}, "arguments": {"type": "object"}, "session": {"type": "string"}},
                   "required": ["call"]}),
    types.Tool(name="agentbatch_state", description="The session's refunds.",
               input_schema={"type": "object", "properties": {"session": {"type": "string"}}}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", required=True)
    add_transport_args(parser)
    args = parser.parse_args()
    path = Path(args.state)

    def load() -> dict[str, Any]:
        return json.loads(path.read_text()) if path.exists() else {"refunds": {}, "keys": []}

    async def call(name: str, a: dict[str, Any]) -> types.CallToolResult:
        state = load()
        session = str(a.get("session", "-"))
        refunds = state["refunds"].setdefault(session, {})
        if name == "cancel_reservation":
            key = a.get("idempotency_key")
            if key is None or key not in state["keys"]:
                refunds[a["reservation"]] = refunds.get(a["reservation"], 0) + 1
                if key is not None:
                    state["keys"].append(key)
            path.write_text(json.dumps(state))
            return text_result({"refunded": a["reservation"], "count": refunds[a["reservation"]]})
        if name == "slow_cancel":  # the side effect first, then a long wait for the answer
            key = a.get("idempotency_key")
            if key is not None and key in state["keys"]:
                return text_result({"refunded": a["reservation"], "count": refunds[a["reservation"]], "again": True})
            refunds[a["reservation"]] = refunds.get(a["reservation"], 0) + 1
            state["keys"] += [key] if key is not None else []
            path.write_text(json.dumps(state))
            await asyncio.sleep(float(a.get("seconds", 0)))
            return text_result({"refunded": a["reservation"], "count": refunds[a["reservation"]]})
        if name == "slow_refund":  # a write that cannot tell a repeat (only the first one is slow)
            refunds[a["reservation"]] = refunds.get(a["reservation"], 0) + 1
            path.write_text(json.dumps(state))
            await asyncio.sleep(float(a.get("seconds", 0)) if refunds[a["reservation"]] == 1 else 0)
            return text_result({"refunded": a["reservation"], "count": refunds[a["reservation"]]})
        if name == "slow_set_status":
            statuses = state.setdefault("status", {}).setdefault(session, {})
            calls = state.setdefault("calls", {}).setdefault(session, {})
            changed = statuses.get(a["reservation"]) != a["status"]
            statuses[a["reservation"]] = a["status"]
            calls[a["reservation"]] = calls.get(a["reservation"], 0) + 1
            path.write_text(json.dumps(state))
            await asyncio.sleep(float(a.get("seconds", 0)) if changed else 0)
            return text_result({"status": a["status"], "calls": calls[a["reservation"]]})
        if name == "slow_notify":  # a write the server keeps no trace of per reservation
            state["notified"] = state.get("notified", 0) + 1
            path.write_text(json.dumps(state))
            await asyncio.sleep(float(a.get("seconds", 0)) if state["notified"] == 1 else 0)
            return text_result({"notified": a["reservation"]})
        if name == "agentbatch_reconcile":
            if a.get("call") != "slow_refund":
                return text_result({"ran": None})
            count = refunds.get((a.get("arguments") or {}).get("reservation"), 0)
            reservation = (a.get("arguments") or {}).get("reservation")
            return text_result({"ran": True, "result": {"refunded": reservation, "count": count}} if count
                               else {"ran": False})
        if name == "agentbatch_state":
            return text_result(refunds)
        return text_result(f"unknown tool {name!r}", is_error=True)

    serve(build_server("ledger", TOOLS, call), args.http)


if __name__ == "__main__":
    main()
