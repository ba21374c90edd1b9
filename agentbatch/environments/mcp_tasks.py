"""The mcp workload for servers you did not write: tasks from a file, tools allowed or hidden by
pattern, per-sample arguments injected into every call, and a scorer given as a plugin callable.

- `task_file`: a JSONL or JSON file (a list, or a mapping with the list under `key`) of records in the
  benchmark's own shape; `fields` maps the workload's task fields (`id`, `turns`, `group`, `system`,
  `ground_truth`) to dotted paths in a record (e.g. `{"id": "task_id", "turns": "user_scenario.messages"}`).
  A record's whole content is kept as the task's `record` for the scorer.
- `tools_allow` / `tools_hide`: shell-style patterns (`fnmatch`) of tool names the model may see and
  call; hidden tools stay callable by the harness (the state tool of the scorer).
- `inject`: arguments added to every call, as templates over the sample (`{task_id}`, `{batch}`,
  `{sample_key}` = "<batch>:<task_id>", and the task's top-level scalar fields), e.g.
  `{"state_key": "{sample_key}"}` isolates each sample's state inside a shared server. Injected
  arguments are hidden from the model's tool schemas.
- `scorer`: "package.module:function" called with a `ScoreInput` (the task, the final text, every
  tool result, the final state from `state_tool`), sync or async, returning a score in [0, 1] or a
  mapping with "score".
"""

from __future__ import annotations

import fnmatch
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from agentbatch.environments.docker_env import tool_calls_of
from agentbatch.environments.mcp_client import result_text
from agentbatch.protocols.environment import TaskSpec
from agentbatch.protocols.plugins import PluginParams, load_target

TASK_FIELDS = ("id", "turns", "group", "system", "ground_truth")


def _dig(record: Any, path: str) -> Any:
    node = record
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(path)
    return node


class TaskFile(PluginParams):
    """workload.params.task_file of the mcp workload."""

    path: str = Field(min_length=1, description="a .jsonl file (one record a line) or a .json file")
    fields: dict[str, str] = Field(default_factory=dict, description="task field -> dotted path in a record")
    key: str | None = Field(None, description="in a .json mapping: the dotted path of the list of records")

    @field_validator("fields")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = set(value) - set(TASK_FIELDS)
        if unknown:
            raise ValueError(f"unknown task fields {sorted(unknown)}; expected some of {TASK_FIELDS}")
        return value

    @field_validator("path")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not Path(value).is_file():
            raise ValueError(f"no such file: {value}")
        return value


def _records(tf: TaskFile) -> list[tuple[str, Any]]:
    """(where, record) of each record: "line N" of a JSONL file, "record N" of a JSON list."""
    path = tf.path
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".jsonl"):
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((f"line {n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"task_file.path: {path} line {n}: not JSON ({exc.msg}, column {exc.colno})") from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"task_file.path: {path} line {exc.lineno}: not JSON ({exc.msg}, column {exc.colno})") from None
    try:
        records = _dig(data, tf.key) if tf.key else data
    except KeyError:
        raise ValueError(f"task_file.key: {path} has no {tf.key!r}") from None
    if not isinstance(records, list):
        raise ValueError(f"task_file: {path}: expected a list of records" + (f" under {tf.key!r}" if tf.key else ""))
    return [(f"record {i}", r) for i, r in enumerate(records)]


def load_task_file(spec: TaskFile | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Task dicts ({id, turns, group?, system?, ground_truth?, record}) from a JSONL/JSON file. A record
    without its id or turns, and a mapped field (`fields`) that no record has, are errors."""
    tf = spec if isinstance(spec, TaskFile) else TaskFile.model_validate(dict(spec))
    path, mapping = tf.path, {f: f for f in TASK_FIELDS} | tf.fields
    records = _records(tf)
    if not records:
        raise ValueError(f"task_file: {path}: expected a non-empty list of records")
    out = []
    found: set[str] = set()
    for where_in_file, record in records:
        task: dict[str, Any] = {"record": record}
        for name, where in mapping.items():
            try:
                task[name] = _dig(record, where)
                found.add(name)
            except KeyError:
                if name in ("id", "turns"):
                    raise ValueError(f"task_file: {path} {where_in_file}: no {where!r} (task field {name!r})") from None
        turns = task["turns"]
        task["turns"] = [turns] if isinstance(turns, str | Mapping) else list(turns)
        out.append(task)
    if missing := sorted(set(tf.fields) - found):  # a typo in an optional mapping: silently nothing otherwise
        raise ValueError("; ".join(f"task_file.fields.{name}: no record of {path} has {tf.fields[name]!r}"
                                   for name in missing))
    return out


def task_specs(tasks: Sequence[Mapping[str, Any]] | None, task_file: TaskFile | Mapping[str, Any] | None) -> list[TaskSpec]:
    """The workload's tasks: the inline ones, then the task file's."""
    rows = list(tasks or []) + (load_task_file(task_file) if task_file else [])
    return [TaskSpec(task_id=str(t["id"]), data={k: v for k, v in t.items() if k != "id"}, group=str(t.get("group") or ""))
            for t in rows]


def select_tasks(tasks: list[TaskSpec], limit: int | None, ids: Sequence[str] | None) -> list[TaskSpec]:
    """The tasks named by `ids` (each must exist), then the first `limit` of them."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit: expected at least 1, got {limit}")
    if ids is not None:
        known = {t.task_id for t in tasks}
        if unknown := [i for i in ids if i not in known]:
            raise ValueError(f"ids: no task {unknown[:5]} among the workload's {len(tasks)} tasks")
        wanted = set(ids)
        tasks = [t for t in tasks if t.task_id in wanted]
    return tasks[:limit] if limit is not None else tasks


@dataclass(frozen=True, slots=True)
class ToolFilter:
    allow: tuple[str, ...] = ()  # empty: every tool
    hide: tuple[str, ...] = ()

    @classmethod
    def of(cls, allow: Sequence[str] | None, hide: Sequence[str] | None) -> ToolFilter:
        return cls(tuple(allow or ()), tuple(hide or ()))

    def visible(self, name: str) -> bool:
        allowed = not self.allow or any(fnmatch.fnmatchcase(name, p) for p in self.allow)
        return allowed and not any(fnmatch.fnmatchcase(name, p) for p in self.hide)


def toolset_problems(route: Mapping[str, Any], visible: Sequence[str], tool_args: Mapping[str, set[str]],
                     workload: Any) -> list[str]:
    """What the servers' tools say about the workload's settings: patterns that match no tool, no tool
    left for the model, an unknown state tool or check tool, an injected argument no tool takes.
    `route`: every tool by exposed name; `visible`: those the model sees; `tool_args`: each tool's arguments."""
    names = sorted(route)
    shown = ", ".join(names[:30]) + (" ..." if len(names) > 30 else "")
    out = _unmatched_patterns(names, workload.tool_filter, shown)
    if not visible:
        out.append(f"tools_allow/tools_hide: the model would see none of the servers' tools ({shown})")
    if workload.state_tool and workload.state_tool not in route:
        out.append(f"state_tool: no tool {workload.state_tool!r} on the servers ({shown})")
    if getattr(workload, "reconcile_tool", None) and workload.reconcile_tool not in route:
        out.append(f"reconcile_tool: no tool {workload.reconcile_tool!r} on the servers ({shown})")
    out += [f"inject.{arg}: no tool of the servers takes an argument {arg!r}"
            for arg in workload.inject if not any(arg in args for args in tool_args.values())]
    checks = {t.task_id: (t.data.get("check") or {}).get("tool") for t in workload.tasks()}
    out += [f"tasks: task {task_id!r}: check.tool {tool!r} is no tool of the servers ({shown})"
            for task_id, tool in checks.items() if tool and tool not in route]
    return out


def _unmatched_patterns(names: Sequence[str], tools: ToolFilter, shown: str) -> list[str]:
    return [f"{what}: {pattern!r} matches no tool of the servers ({shown})"
            for what, patterns in (("tools_allow", tools.allow), ("tools_hide", tools.hide))
            for pattern in patterns if not any(fnmatch.fnmatchcase(n, pattern) for n in names)]


def strip_injected(schema: dict[str, Any], injected: Sequence[str]) -> dict[str, Any]:
    """A tool's input schema without the arguments the harness fills in (the model never sets them)."""
    if not injected:
        return schema
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in injected}
    required = [r for r in schema.get("required") or [] if r not in injected]
    return {**schema, "properties": props, "required": required}


def sample_context(task: TaskSpec, batch_label: str | None) -> dict[str, Any]:
    batch = batch_label or "batch"
    scalars = {k: v for k, v in task.data.items() if isinstance(v, str | int | float | bool)}
    return {**scalars, "task_id": task.task_id, "batch": batch, "sample_key": f"{batch}:{task.task_id}"}


def injected_args(templates: Mapping[str, str], context: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for name, template in templates.items():
        try:
            out[name] = str(template).format(**context)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"inject.{name}: cannot fill {template!r} for task {context.get('task_id')!r} ({exc!r}); "
                             f"a template may use {', '.join('{' + k + '}' for k in sorted(context))}") from None
    return out


@dataclass
class ScoreInput:
    task: TaskSpec
    final_text: str | None  # the assistant's last answer without tool calls
    tool_results: list[dict[str, Any]] = field(default_factory=list)  # {name, arguments, content, is_error, latency_s}
    state: Any = None  # the state tool's result (JSON-decoded when it is JSON), or None


def load_scorer(target: str | None) -> Callable[[ScoreInput], Any] | None:
    """The scorer plugin ("package.module:function"); a PluginError (ValueError) when it cannot be imported."""
    return load_target(target) if target else None


async def score_with_plugin(env: Any, toolset: Any) -> dict[str, Any]:
    """Score a sample of the mcp workload with its scorer plugin: the final state (from the workload's
    `state_tool`, called with the sample's injected arguments), every tool result, the final text."""
    state = None
    if env.workload.state_tool:
        conn, tool_name = toolset.route[env.workload.state_tool]
        state = decode(result_text(await conn.call(tool_name, dict(env.injected))))
    results = [{k: c.get(k) for k in ("name", "arguments", "content", "error", "latency_s")} for c in env.call_log]
    result = await run_scorer(env.workload.scorer, ScoreInput(env.task, env.final_text, results, state))
    result.setdefault("tool_latency_s", [None if c.get("latency_s") is None else round(c["latency_s"], 6)
                                         for c in env.call_log])
    return result


def recorded_calls(pairs: Sequence[Any]) -> tuple[list[dict[str, Any]], str | None]:
    """From the recorded turns of a resumed sample: its tool calls with their recorded results (no
    latency: measured by the earlier process), and its last final text."""
    calls: list[dict[str, Any]] = []
    final = None
    for assistant, results in pairs:
        parsed = tool_calls_of(assistant)
        if not parsed:
            final = assistant.get("content")
        by_id = {m.get("tool_call_id"): m for m in results if m.get("role") == "tool"}
        for call_id, name, args, _ in parsed:
            content = (by_id.get(call_id) or {}).get("content")
            calls.append({"name": name, "arguments": args, "content": content, "error": None, "latency_s": None})
    return calls, final


async def run_scorer(scorer: Callable[[ScoreInput], Any], data: ScoreInput) -> dict[str, Any]:
    value = scorer(data)
    if inspect.isawaitable(value):
        value = await value
    result = dict(value) if isinstance(value, Mapping) else {"score": value}
    score = float(result["score"])
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"scorer returned score {score}; expected a number in [0, 1]")
    result["score"] = score
    return result


def decode(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
