"""The "mcp" workload: tools discovered from MCP servers, called on the model's behalf.

Servers are given as specs (`command` + `args` over stdio, or a streamable-HTTP `url`). Shared
servers (the default) are started once for the whole batch and serve every sample concurrently;
with `per_sample=True` each sample starts its own (stateful tools, e.g. the BFCL backends), with
`{key}` placeholders in the spec filled from the task's data. A concurrency limit (`max_calls`) is
the environment capacity. Tool names that clash across servers get the server's name as prefix;
tools named `agentbatch_*` are the harness's and are hidden from the model.

Tool results with isError (and JSON-RPC errors of a live server) are observations counted in
`EnvResult.tool_errors`; a dead server, a broken transport or a call without answer raise
`EnvironmentFailure`. A per-sample environment then closes its servers, and the next call starts
fresh ones and re-runs the sample's completed tool calls to rebuild their state.

`preset="bfcl"` builds the tasks from BFCL multi-turn entries (`category`, `limit`, `ids`): each
sample gets its own `bfcl_server`, the user turns come one by one, and the score is 1.0 when the
backends' final state equals the state the ground truth leads to.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import inspect
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from agentbatch.environments.capacity import CapacityLimiter
from agentbatch.environments.docker_env import tool_calls_of
from agentbatch.environments.mcp_client import McpConnection, McpServerSpec, result_text
from agentbatch.environments.mcp_reconcile import reconcile_step
from agentbatch.environments.mcp_tasks import (
    TaskFile,
    ToolFilter,
    injected_args,
    load_scorer,
    recorded_calls,
    sample_context,
    score_with_plugin,
    select_tasks,
    strip_injected,
    task_specs,
    toolset_problems,
)
from agentbatch.protocols.engine import Message, ToolSchema
from agentbatch.protocols.environment import EnvironmentFailure, EnvReset, EnvResult, RecordedTurn, TaskSpec
from agentbatch.protocols.in_flight import Reconciled

HIDDEN_PREFIX = "agentbatch_"
IDEMPOTENCY_KEY = "idempotency_key"  # a tool argument the harness fills: the same step sends the same key
IN_FLIGHT_POLICIES = ("retry", "fail")
BFCL_SERVER = "agentbatch.environments.mcp_servers.bfcl_server"


class Toolset:
    """The tools of a set of connections, as the model sees them, and where each one lives."""

    def __init__(self, connections: list[McpConnection], tools: ToolFilter | None = None,
                 injected: Sequence[str] = ()) -> None:
        self.connections = connections
        self.tools, self.injected = tools, list(injected)
        self.route: dict[str, tuple[McpConnection, str]] = {}
        self.schemas: list[ToolSchema] = []
        self.hidden: set[str] = set()  # callable by the harness only (state tools, tools_hide patterns)
        self.idempotent: set[str] = set()  # tools that take an idempotency key (filled by the harness)
        # tools a crash may leave done but unrecorded that can run again: an idempotency key, or the
        # server's own annotation (MCP `readOnlyHint` / `idempotentHint`)
        self.retry_safe: set[str] = set()
        counts: dict[str, int] = {}
        for conn in connections:
            for tool in conn.tools:
                counts[tool.name] = counts.get(tool.name, 0) + 1
        for conn in connections:
            for tool in conn.tools:
                exposed = tool.name if counts[tool.name] == 1 else f"{conn.spec.name}__{tool.name}"
                self.route[exposed] = (conn, tool.name)
                if tool.name.startswith(HIDDEN_PREFIX) or (tools is not None and not tools.visible(exposed)):
                    self.hidden.add(exposed)
                    continue
                self._note_safety(exposed, tool)
                self.schemas.append(
                    {
                        "type": "function",
                        "function": {
                            "name": exposed,
                            "description": tool.description or "",
                            "parameters": strip_injected(tool.input_schema or {"type": "object", "properties": {}},
                                                         [*injected, IDEMPOTENCY_KEY]),
                        },
                    }
                )


    def _note_safety(self, exposed: str, tool: Any) -> None:
        if IDEMPOTENCY_KEY in ((tool.input_schema or {}).get("properties") or {}):
            self.idempotent.add(exposed)
        hints = tool.annotations
        if exposed in self.idempotent or (hints is not None and (hints.read_only_hint or hints.idempotent_hint)):
            self.retry_safe.add(exposed)


async def reconnect_dead(toolset: Toolset, call_timeout_s: float) -> Toolset:
    """The toolset with only its dead connections started again: healthy ones, and the calls other
    samples have in flight on them, are kept."""
    dead = [i for i, c in enumerate(toolset.connections) if not c.alive]
    if not dead:
        return toolset
    await asyncio.gather(*(toolset.connections[i].close() for i in dead), return_exceptions=True)
    fresh = await open_toolset([toolset.connections[i].spec for i in dead], call_timeout_s)
    replaced = dict(zip(dead, fresh.connections, strict=True))
    return Toolset([replaced.get(i, c) for i, c in enumerate(toolset.connections)], toolset.tools, toolset.injected)


async def open_toolset(specs: Sequence[McpServerSpec], call_timeout_s: float, tools: ToolFilter | None = None,
                       injected: Sequence[str] = ()) -> Toolset:
    conns = [McpConnection(s, call_timeout_s=call_timeout_s) for s in specs]
    try:
        await asyncio.gather(*(c.start() for c in conns))
    except BaseException:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        raise
    return Toolset(conns, tools, injected)


class McpEnvironment:
    blocking = False

    def __init__(self, workload: McpWorkload, task: TaskSpec) -> None:
        self.workload = workload
        self.task = task
        self.toolset: Toolset | None = None
        self.turn = 0  # index of the current user turn
        self.history: list[Message] = []  # assistant messages whose steps completed
        self.call_log: list[dict[str, Any]] = []  # (name, start, end, error) of each call, for reports
        self._dirty = False
        self.final_text: str | None = None  # the last answer without tool calls (for a scorer plugin)
        self.context = sample_context(task, workload.batch_label)
        self.injected = injected_args(workload.inject, self.context)

    def _turns(self) -> list[Message]:
        return [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in self.task.data["turns"]]

    async def _ensure_toolset(self) -> Toolset:
        external = self.workload.restore_mode == "external"
        if self._dirty and self.workload.per_sample and not external:
            await self._drop_toolset()
        self._dirty = False
        if self.toolset is not None and all(c.alive for c in self.toolset.connections):
            return self.toolset
        if not self.workload.per_sample:  # shared: the workload restarts only the servers that died
            self.toolset = await self.workload.shared_toolset()
            return self.toolset
        if self.toolset is not None and external:  # the state lives elsewhere: reconnect what died only
            self.toolset = await reconnect_dead(self.toolset, self.workload.call_timeout_s)
            return self.toolset
        await self._drop_toolset()
        specs = self.workload.specs_for(self.task, self.context)
        self.toolset = await open_toolset(specs, self.workload.call_timeout_s, self.workload.tool_filter,
                                          list(self.workload.inject))
        if external:
            return self.toolset  # reattached by the sample key: never re-execute a recorded call
        try:  # rebuild the servers' state from this sample's completed turns (after a failure)
            for assistant in self.history:
                await self._run_calls(assistant, record=False)
        except BaseException:
            await self._drop_toolset()
            raise
        return self.toolset

    async def _drop_toolset(self) -> None:
        toolset, self.toolset = self.toolset, None
        if toolset is not None and self.workload.per_sample:
            await asyncio.gather(*(c.close() for c in toolset.connections), return_exceptions=True)

    async def reset(self, task: TaskSpec) -> EnvReset:
        self.task, self.turn, self.history = task, 0, []
        toolset = await self._ensure_toolset()
        system = task.data.get("system")
        messages = ([{"role": "system", "content": system}] if system else []) + [self._turns()[0]]
        return EnvReset(tools=toolset.schemas, messages=messages)

    async def step(self, assistant: Message) -> EnvResult:
        if not assistant.get("tool_calls"):
            self.history.append(assistant)
            self.final_text = assistant.get("content")
            self.turn += 1
            turns = self._turns()
            if self.turn < len(turns):
                return EnvResult(messages=[turns[self.turn]])
            return EnvResult(messages=[], done=True)
        await self._ensure_toolset()
        self._dirty = True  # until the calls complete: a cancelled step leaves per-sample state unknown
        try:
            result = await self._run_calls(assistant, record=True)
        except EnvironmentFailure:
            if self.workload.restore_mode == "replay":
                await self._drop_toolset()  # per-sample: fresh servers + replay on the retry
            raise
        self._dirty = False
        self.history.append(assistant)
        return result

    async def _run_calls(self, assistant: Message, *, record: bool) -> EnvResult:
        assert self.toolset is not None
        calls = tool_calls_of(assistant)

        async def one(call_id: str, name: str, args: dict[str, Any] | None, error: str | None) -> tuple[Message, bool]:
            target = self.toolset.route.get(name) if self.toolset and name not in self.toolset.hidden else None
            if error or target is None:
                text = f"error: {error}" if error else f"error: unknown tool {name!r}"
                return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text}, True
            conn, tool_name = target
            extra = dict(self.injected)
            if self.toolset is not None and name in self.toolset.idempotent:
                # A retry of this step, or its re-run after a crash, sends the same key: the server can
                # tell that it already did the call.
                extra[IDEMPOTENCY_KEY] = f"{self.context['sample_key']}/{len(self.history)}/{call_id}"
            loop = asyncio.get_running_loop()
            async with self.workload.calls.slot():
                start = loop.time()
                res = await conn.call(tool_name, {**(args or {}), **extra})
                end = loop.time()
            if record:  # per call: its latency, and its result for a scorer plugin
                self.call_log.append({"name": name, "arguments": args, "start": start, "end": end,
                                      "latency_s": end - start, "error": bool(res.is_error),
                                      "content": result_text(res)})
            msg = {"role": "tool", "tool_call_id": call_id, "name": name, "content": result_text(res)}
            return msg, bool(res.is_error)

        if self.workload.parallel_calls:
            outcomes = await asyncio.gather(*(one(*c) for c in calls))
        else:  # stateful tools: in the order the model gave them
            outcomes = [await one(*c) for c in calls]
        return EnvResult(
            messages=[m for m, _ in outcomes],
            tool_calls=len(calls),
            tool_errors=sum(e for _, e in outcomes),
        )

    def unsafe_calls(self, assistant: Message) -> list[str]:
        """The calls of this step that running again after a crash could repeat: tools without an
        idempotency key and not annotated read-only or idempotent (an unknown tool never runs)."""
        safe = self.toolset.retry_safe if self.toolset is not None else set()
        route = self.toolset.route if self.toolset is not None else {}
        return [name for _, name, _, error in tool_calls_of(assistant)
                if not error and name in route and name not in safe]

    async def reconcile(self, assistant: Message) -> Reconciled:
        """After a crash cut this step short: did it take effect? (`environments/mcp_reconcile.py`).
        "ran": this environment is then as after the step."""
        answer = await reconcile_step(self, assistant)
        if answer.status == "ran" and answer.result is not None:
            self.history.append(assistant)
            self.call_log += [{"name": m.get("name"), "arguments": None, "content": m.get("content"), "error": False,
                               "latency_s": None} for m in answer.result.messages]
        return answer

    async def toolset_for_reconcile(self) -> Toolset:
        return await self._ensure_toolset()

    @property
    def restore_mode(self) -> str:
        return self.workload.restore_mode

    @property
    def in_flight(self) -> str:
        """What a resume does with a step of this (external) environment cut short by a crash."""
        return self.workload.in_flight

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        """"replay": fresh per-sample servers re-run the recorded calls; "external": the state lives
        elsewhere: reconnect (by the sample key) and re-execute nothing."""
        assistants = [assistant for assistant, _ in pairs]
        self.history = list(assistants)
        self.call_log, self.final_text = recorded_calls(pairs)  # recorded results, for a scorer plugin
        self.turn = sum(1 for a in assistants if not a.get("tool_calls"))
        if self.workload.per_sample and self.workload.restore_mode == "replay":
            await self._drop_toolset()  # fresh servers, then the recorded calls re-run
        await self._ensure_toolset()

    async def score(self) -> dict[str, Any]:
        if self.workload.scorer is not None:
            return await score_with_plugin(self, await self._ensure_toolset())
        check = self.task.data.get("check")
        if not check:
            return {"score": 0.0, "reason": "task has no check"}
        toolset = await self._ensure_toolset()
        conn, tool_name = toolset.route[check["tool"]]
        res = await conn.call(tool_name, check.get("arguments", {}))
        text = result_text(res)
        if "expect_json" in check:
            ok = not res.is_error and _canonical(json.loads(text)) == _canonical(check["expect_json"])
        else:
            ok = not res.is_error and text == check.get("expect")
        return {"score": 1.0 if ok else 0.0, "turns_done": self.turn}

    async def close(self) -> None:
        await self._drop_toolset()
        self.toolset = None


def run_now(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _canonical(value: Any) -> str:
    # Through JSON once first: keys become strings (mixed int/str keys cannot be sorted).
    return json.dumps(json.loads(json.dumps(value, default=repr)), sort_keys=True)


class McpWorkload:
    """Factory of the mcp workload (`workload.params` are its keyword arguments).

    servers: list of server specs ({name, command, args, env, cwd} or {name, url}).
    tasks: list of {id, turns: [user text, ...], system?, ground_truth?, check?, server_params?}.
    preset: "bfcl" (with category, limit, ids) instead of servers/tasks.
    per_sample: a server set per sample (default: shared by the whole batch; bfcl: per sample).
    task_file, tools_allow, tools_hide, inject, scorer, state_tool: for servers you did not write
    (see mcp_tasks.py); restore_mode: "external" when the servers keep the state (never re-executed);
    reconcile_tool: a server tool asked after a crash whether a step cut short ran (mcp_reconcile.py).
    max_calls: tool calls at once over the batch (None: unlimited); call_timeout_s: per call.
    parallel_calls: run one assistant message's calls concurrently (default: in order).
    """

    name = "mcp"

    def __init__(
        self,
        servers: list[dict[str, Any]] | None = None,
        tasks: list[dict[str, Any]] | None = None,
        preset: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        ids: list[str] | None = None,
        per_sample: bool | None = None,
        max_calls: int | None = None,
        call_timeout_s: float = 60.0,
        parallel_calls: bool = False,
        task_file: TaskFile | None = None,
        tools_allow: list[str] | None = None,
        tools_hide: list[str] | None = None,
        inject: dict[str, str] | None = None,
        scorer: str | None = None,
        state_tool: str | None = None,
        reconcile_tool: str | None = None,
        restore_mode: Literal["replay", "external"] = "replay",
        in_flight: Literal["retry", "fail"] = "retry",
        batch_label: str | None = None,
    ) -> None:
        if preset == "bfcl":
            servers = servers or [
                {"name": "bfcl", "command": sys.executable, "args": ["-m", BFCL_SERVER, "--entry", "{entry}", "--expose-state"]}
            ]
            tasks = tasks or bfcl_tasks(category or "multi_turn_base", limit, ids)
            per_sample = True if per_sample is None else per_sample
        elif preset is not None:
            raise ValueError(f"preset: unknown preset {preset!r}; expected 'bfcl'")
        elif category is not None:
            raise ValueError("category: a BFCL category, only with preset: bfcl")
        if not servers:
            raise ValueError("servers: give servers (or preset='bfcl')")
        self.specs = [McpServerSpec.from_params(s) for s in servers]
        selected = task_specs(tasks, task_file)
        self._tasks = selected if preset == "bfcl" else select_tasks(selected, limit, ids)
        self.tool_filter = ToolFilter.of(tools_allow, tools_hide)
        self.inject, self.batch_label, self.state_tool = dict(inject or {}), batch_label, state_tool
        self.scorer = load_scorer(scorer)
        self.per_sample = bool(per_sample)
        for task in self._tasks:  # every template fills for every task, before anything runs
            context = sample_context(task, batch_label)
            injected_args(self.inject, context)
            if self.per_sample:
                self.specs_for(task, context)
        self.calls = CapacityLimiter(max_calls, "mcp-calls")
        self.call_timeout_s = call_timeout_s
        self.parallel_calls = parallel_calls
        # "replay": servers started per sample hold the state; "external": it lives elsewhere.
        self.restore_mode = restore_mode
        self.in_flight = in_flight  # external step cut short by a crash: run it again (same key) or fail
        self.reconcile_tool = reconcile_tool  # asked after a crash whether such a step ran (mcp_reconcile.py)
        self._shared: Toolset | None = None
        self._shared_lock = asyncio.Lock()

    @property
    def reconciles(self) -> bool:
        """Its environments answer `reconcile` (protocols/in_flight.py) when a reconcile_tool is set."""
        return self.reconcile_tool is not None

    @staticmethod
    def absolute_params(params: dict[str, Any], base: Path) -> dict[str, Any]:
        """The params with relative paths made absolute against `base` (where the config was loaded), so
        that a resume from another folder reads the same task file and starts the servers in the same
        folder: `task_file.path`, and each stdio server's `cwd` (`base` when not given)."""
        out = dict(params)
        task_file = out.get("task_file")
        if isinstance(task_file, dict) and isinstance(task_file.get("path"), str):
            out["task_file"] = {**task_file, "path": os.path.abspath(base / task_file["path"])}
        if isinstance(out.get("servers"), list):
            out["servers"] = [
                {**s, "cwd": os.path.abspath(base / (s.get("cwd") or "."))}
                if isinstance(s, dict) and s.get("command") and "{" not in str(s.get("cwd") or "") else s
                for s in out["servers"]]
        return out

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def specs_for(self, task: TaskSpec, context: dict[str, Any]) -> list[McpServerSpec]:
        """A per-sample server set: `{key}` placeholders filled from the task's `server_params` and its key."""
        values = {**task.data.get("server_params", {}), "sample_key": context["sample_key"]}
        try:
            return [s.formatted(values) for s in self.specs]
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"servers: cannot fill the placeholders of the server specs for task {task.task_id!r} "
                             f"({exc!r}); known: {', '.join(sorted(values))}") from None

    def check(self) -> None:
        """Before a batch is written: start the servers (a sample's own, when per sample), list their
        tools and check the settings against them (`toolset_problems`); ValueError naming each field."""
        run_now(self._check())

    async def _check(self) -> None:
        task = self._tasks[0]
        specs = self.specs_for(task, sample_context(task, self.batch_label)) if self.per_sample else self.specs
        try:
            toolset = await open_toolset(specs, self.call_timeout_s, self.tool_filter, list(self.inject))
        except Exception as exc:  # noqa: BLE001 - any failure to start or reach a server is reported
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"servers: cannot start or reach {names}: {type(exc).__name__}: {exc}") from None
        try:
            tool_args = {name: set((tool.input_schema or {}).get("properties") or {})
                         for name, (conn, tool_name) in toolset.route.items()
                         for tool in conn.tools if tool.name == tool_name}
            problems = toolset_problems(toolset.route, [s["function"]["name"] for s in toolset.schemas],
                                        tool_args, self)
        finally:
            await asyncio.gather(*(c.close() for c in toolset.connections), return_exceptions=True)
        if problems:
            raise ValueError("; ".join(problems))

    def create(self, task: TaskSpec) -> McpEnvironment:
        return McpEnvironment(self, task)

    async def shared_toolset(self) -> Toolset:
        async with self._shared_lock:
            if self._shared is None:
                self._shared = await open_toolset(self.specs, self.call_timeout_s, self.tool_filter, list(self.inject))
            else:  # a shared server died: start it again, and only it
                self._shared = await reconnect_dead(self._shared, self.call_timeout_s)
            return self._shared

    async def aclose(self) -> None:
        if self._shared is not None:
            await asyncio.gather(*(c.close() for c in self._shared.connections), return_exceptions=True)
            self._shared = None


# --------------------------------------------------------------------------------------- BFCL


def parse_call(text: str, signatures: dict[str, inspect.Signature] | None = None) -> dict[str, Any]:
    """A BFCL ground-truth call string, e.g. "mv(source='a', destination='b')" -> {name, arguments}.

    Positional arguments ("sort('a.txt')") are named from the method's signature.
    """
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text!r}")
    func = node.func
    name = func.id if isinstance(func, ast.Name) else ast.unparse(func)
    args = [ast.literal_eval(a) for a in node.args]
    if any(kw.arg is None for kw in node.keywords):
        raise ValueError(f"'**' arguments are not supported: {text!r}")
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    if args:
        if not signatures or name not in signatures:
            raise ValueError(f"positional arguments but no signature for {name!r}: {text!r}")
        kwargs = dict(signatures[name].bind(*args, **kwargs).arguments)
    return {"name": name, "arguments": kwargs}


def bfcl_tasks(category: str, limit: int | None, ids: list[str] | None) -> list[dict[str, Any]]:
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    from agentbatch.environments.mcp_servers.bfcl_server import Backends

    truth = {g["id"]: g["ground_truth"] for g in load_ground_truth_entry(category)}
    entries = load_dataset_entry(category)
    if ids is not None:
        if unknown := sorted(set(ids) - {e["id"] for e in entries}):
            raise ValueError(f"ids: no BFCL task {unknown[:5]} in category {category!r}")
        entries = [e for e in entries if e["id"] in ids]
    out = []
    for entry in entries[:limit]:
        # The state the ground truth leads to, computed in-process with the same backend classes.
        backends = Backends(
            entry["involved_classes"],
            entry.get("initial_config"),
            entry.get("excluded_function"),
            long_context="long_context" in category,
        )
        signatures = {n: inspect.signature(getattr(o, m)) for n, (o, m) in backends.methods.items()}
        gt_turns = [[parse_call(c, signatures) for c in turn] for turn in truth[entry["id"]]]
        for turn in gt_turns:
            for call in turn:
                obj, method = backends.methods[call["name"]]
                getattr(obj, method)(**call["arguments"])
        expected = json.loads(_canonical(backends.state()))
        turns = [t[0] if t else {"role": "user", "content": ""} for t in entry["question"]]
        out.append(
            {
                "id": entry["id"],
                "turns": turns,
                "ground_truth": gt_turns,
                "server_params": {"entry": entry["id"]},
                "check": {"tool": "agentbatch_state", "expect_json": expected},
            }
        )
    return out
