"""BFCL multi-turn workload from the `bfcl-eval` package.

The 800 multi-turn tasks (base, miss_func, miss_param, long_context; 200 each), with bfcl's real
backend classes (GorillaFileSystem, TwitterAPI, ...) instantiated per sample instead of bfcl's
module-global cache (which collides under concurrency), multi-turn user turns (including the
"functions added" turns of miss_func), and the official `multi_turn_checker` for the score.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import itertools
import json
import random
import re
from functools import cache
from typing import Any, Literal, get_args

from pydantic import Field

from agentbatch.protocols.engine import Message, ToolSchema
from agentbatch.protocols.environment import (
    EnvReset,
    EnvResult,
    GroundTruthTurn,
    RecordedTurn,
    RestoreMode,
    TaskSpec,
)
from agentbatch.protocols.plugins import PluginParams

Category = Literal["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
CATEGORIES: tuple[Category, ...] = get_args(Category)
FORBIDDEN_CALLS = {"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"}  # as bfcl's executor


@cache
def _raw_entries(category: str) -> dict[str, dict[str, Any]]:
    """The category's test entries as stored (with ground truth), in file order, function docs not yet
    added: bfcl's `load_dataset_entry` adds them to every entry of a category, re-reading the docs files
    per entry (~1 s for the four categories), when a batch needs the few it runs."""
    from bfcl_eval import utils

    entries = {e["id"]: e for e in utils.load_file(utils.PROMPT_PATH / f"{utils.VERSION_PREFIX}_{category}.json")}
    for gt in utils.load_ground_truth_entry(category):
        entries[gt["id"]]["ground_truth"] = gt["ground_truth"]
    return entries


@cache
def entry(task_id: str) -> dict[str, Any]:
    """The bfcl test entry (with ground truth) of a task id, e.g. 'multi_turn_base_12': as bfcl's
    `load_dataset_entry` makes it (the same steps, on this entry only)."""
    from bfcl_eval import utils

    category = task_id.rsplit("_", 1)[0]
    if category not in CATEGORIES:
        raise ValueError(f"not a BFCL multi-turn task id: {task_id!r}")
    one = [copy.deepcopy(_raw_entries(category)[task_id])]
    one = utils.process_agentic_test_case(one)
    one = utils.populate_test_cases_with_predefined_functions(one)
    return utils.add_language_specific_hint_to_function_doc(one)[0]


def to_openai_tool(doc: dict[str, Any]) -> ToolSchema:
    """bfcl function doc -> OpenAI tool schema (bfcl says type "dict" where JSON Schema says "object")."""

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: fix(v) for k, v in node.items()}
            if out.get("type") == "dict":
                out["type"] = "object"
            if out.get("type") == "float":
                out["type"] = "number"
            if out.get("type") == "tuple":
                out["type"] = "array"
            return out
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": fix(doc.get("parameters", {"type": "object", "properties": {}})),
        },
    }


def parse_call(text: str, tools: list[ToolSchema]) -> tuple[str, dict[str, Any]]:
    """Parse a ground-truth call like "mv(source='a', destination='b')" into (name, arguments).
    Positional arguments are named after the schema's parameters in order."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a function call: {text!r}") from exc
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    name = node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    if node.args:
        schema = next((t["function"] for t in tools if t["function"]["name"] == name), None)
        if schema is None:
            raise ValueError(f"positional arguments for unknown function {name!r}")
        names = list(schema["parameters"].get("properties", {}))
        for pname, value in zip(names, node.args, strict=False):
            args[pname] = ast.literal_eval(value)
    return name, args


def call_to_string(name: str, arguments: dict[str, Any]) -> str:
    """The bfcl "decoded" form of a call, as the checker expects: name(k=repr(v), ...)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _load_class(class_name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


class BfclEnvironment:
    """One sample of a BFCL multi-turn task."""

    restore_mode: RestoreMode = "replay"  # in-process backends: re-executing rebuilds their state
    blocking = False  # the backends are fast pure Python; the loop is cheaper than a thread hop

    def __init__(self, task: TaskSpec) -> None:
        self.task = task
        self.entry = entry(task.task_id)
        self.turn = 0
        self.decoded: list[list[list[str]]] = []  # per turn, per step, the calls (checker input)
        self.tools: list[ToolSchema] = []
        self._methods: dict[str, Any] = {}

    # --- lifecycle -------------------------------------------------------------------------------
    async def reset(self, task: TaskSpec) -> EnvReset:
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        e = self.entry
        long_context = "long_context" in e["id"]
        self._methods = {}
        for class_name in e["involved_classes"]:
            instance = _load_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(e["initial_config"].get(class_name, {})),
                                        long_context=long_context)
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self._methods[method_name] = method
        self.tools = [to_openai_tool(doc) for doc in e["function"]]
        self.turn = 0
        self.decoded = [[]]
        return EnvReset(tools=list(self.tools), messages=list(e["question"][0]))

    async def step(self, assistant: Message) -> EnvResult:
        calls = assistant.get("tool_calls") or []
        if calls:
            messages = []
            step_calls: list[str] = []
            errors = 0
            for call in calls:
                fn = call.get("function", {})
                name = fn.get("name", "")
                try:
                    arguments = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError as exc:
                    arguments, result = None, f"Error during execution: invalid JSON arguments: {exc}"
                if arguments is not None:
                    result = self._execute(name, arguments)
                    step_calls.append(call_to_string(name, arguments))
                errors += result.startswith("Error during execution")
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
            self.decoded[self.turn].append(step_calls)
            return EnvResult(messages=messages, tool_calls=len(calls), tool_errors=errors)
        return self._next_turn()

    def _execute(self, name: str, arguments: dict[str, Any]) -> str:
        if name in FORBIDDEN_CALLS:
            return f"Error during execution: Function call {name} is not allowed."
        method = self._methods.get(name)
        if method is None:
            return f"Error during execution: name '{name}' is not defined"
        try:
            result = method(**arguments)
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation, as in bfcl
            return f"Error during execution: {exc}"
        if isinstance(result, str):
            return result
        if isinstance(result, dict):
            try:
                return json.dumps(result)
            except (TypeError, ValueError):
                return str(result)
        return str(result)

    def _next_turn(self) -> EnvResult:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

        questions = self.entry["question"]
        self.turn += 1
        if self.turn >= len(questions):
            return EnvResult(messages=[], done=True)
        self.decoded.append([])
        messages = list(questions[self.turn])
        added = self.entry.get("missed_function", {}).get(str(self.turn))
        info: dict[str, Any] = {"turn": self.turn}
        if added:
            new_tools = [to_openai_tool(doc) for doc in added]
            self.tools.extend(new_tools)
            info["tools"] = list(self.tools)  # the agent loop replaces its tool list
            messages = [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        return EnvResult(messages=messages, info=info)

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        # Backends are deterministic: re-executing the recorded turns rebuilds their state.
        for message, _ in pairs:
            await self.step(message)

    async def score(self) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker_module
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        gt = self.entry["ground_truth"]
        decoded = [self.decoded[i] if i < len(self.decoded) else [] for i in range(len(gt))]
        # The checker caches backend instances in this process's module globals keyed by model name:
        # a unique name per call keeps concurrent and repeated scorings apart; the instances are
        # dropped after. (A counter: uuid4 reads os.urandom, ~1 ms a call on a busy VM.)
        model_name = f"agentbatch_{next(_SCORINGS)}"
        try:
            result = checker_module.multi_turn_checker(
                decoded, gt, self.entry, self.entry["id"].rsplit("_", 1)[0], model_name
            )
        finally:
            prefix = re.sub(r"[-./:]", "_", model_name)
            for key in [k for k in vars(multi_turn_utils) if k.startswith(prefix)]:
                del vars(multi_turn_utils)[key]
        valid = bool(result.get("valid"))
        return {"score": 1.0 if valid else 0.0, "valid": valid,
                "error_type": result.get("error_type"), "turns": len(gt)}

    async def close(self) -> None:
        self._methods.clear()


_SCORINGS = itertools.count()


class BfclParams(PluginParams):
    categories: list[Category] | None = Field(None, description="default: all four")
    limit: int | None = Field(None, ge=1, description="first N tasks (after the shuffle)")
    seed: int | None = Field(None, description="shuffle the tasks with this seed")
    task_ids: list[str] | None = Field(None, min_length=1, description="these tasks instead")


class BfclWorkload:
    """The BFCL multi-turn tasks as a workload. Params: categories, limit, seed, task_ids."""

    name = "bfcl"
    Params = BfclParams

    def __init__(
        self,
        categories: list[str] | None = None,
        limit: int | None = None,
        seed: int | None = None,
        task_ids: list[str] | None = None,
    ) -> None:
        cats = list(categories or CATEGORIES)
        unknown = [c for c in cats if c not in CATEGORIES]
        if unknown:
            raise ValueError(f"unknown BFCL categories {unknown}; expected some of {list(CATEGORIES)}")
        self.categories = cats
        self.limit = limit
        self.seed = seed
        self.task_ids = task_ids

    def tasks(self) -> list[TaskSpec]:
        if self.task_ids:
            ids = list(self.task_ids)
            for task_id in ids:
                try:
                    entry(task_id)  # validates
                except KeyError:
                    raise ValueError(f"unknown BFCL task id {task_id!r}") from None
        else:
            ids = [tid for c in self.categories for tid in _raw_entries(c)]
            if self.seed is not None:
                random.Random(self.seed).shuffle(ids)
        if self.limit is not None:
            ids = ids[: self.limit]
        return [TaskSpec(task_id=tid, data={"category": tid.rsplit("_", 1)[0]}, group=tid.rsplit("_", 1)[0])
                for tid in ids]

    def create(self, task: TaskSpec) -> BfclEnvironment:
        return BfclEnvironment(task)

    def ground_truth(self, task: TaskSpec) -> list[GroundTruthTurn]:
        """Per turn, the ground-truth calls as {"name", "arguments"} (for the scripted engine)."""
        e = entry(task.task_id)
        docs = list(e["function"]) + [d for ds in e.get("missed_function", {}).values() for d in ds]
        tools = [to_openai_tool(d) for d in docs]
        turns = []
        for calls in e["ground_truth"]:
            parsed = [parse_call(c, tools) for c in calls]
            turns.append(GroundTruthTurn([{"name": n, "arguments": a} for n, a in parsed]))
        return turns

    async def aclose(self) -> None:
        return None
