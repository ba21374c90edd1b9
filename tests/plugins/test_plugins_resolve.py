"""The plugin resolver: the three `kind` forms, parameter models, and the config's one validation pass."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentbatch.engines.registry import make_engines
from agentbatch.environments.registry import make_workload
from agentbatch.flows.config import ConfigError, policy_plugin, validate_config
from agentbatch.protocols.environment import GroundTruthTurn, RecordedTurn, ground_truth_turns
from agentbatch.protocols.plugins import PluginError, PluginParams, registered, resolve

pytestmark = pytest.mark.usefixtures("toolbench_installed")


@pytest.mark.parametrize("kind", ["bfcl", "toolbench", "toolbench.workload:ToolBench"],
                         ids=["built-in name", "entry point of an installed package", "module:Object"])
def test_three_kind_forms_resolve_and_validate(kind: str) -> None:
    plugin = resolve("workload", kind)
    assert plugin.kind == kind and ":" in plugin.target
    params = {"limit": 2} if kind == "bfcl" else {"tasks_per_suite": 2}
    validated = plugin.validate(params)
    assert validated.items() >= params.items()  # what the config gave, and the model's defaults for the rest
    with pytest.raises(Exception, match="Extra inputs"):
        plugin.validate({"no_such_param": 1})
    config = validate_config({"workload": {"kind": kind, "params": params}})
    assert config.workload_plugin().obj is plugin.obj


class DeclaredOnce:
    """A workload whose defaults live only in its Params model."""

    class Params(PluginParams):
        size: int = 3
        label: str = "x"

    def __init__(self, size: int, label: str) -> None:  # no defaults here: the model's are passed
        self.size, self.label = size, label


def test_defaults_come_from_the_params_model() -> None:
    plugin = resolve("workload", f"{__name__}:DeclaredOnce")
    assert plugin.validate({"size": 5}) == {"size": 5, "label": "x"}
    built = plugin.obj(**plugin.validate({}))
    assert (built.size, built.label) == (3, "x")
    bfcl = resolve("workload", "bfcl")
    assert bfcl.validate({"limit": 2}) == {"categories": None, "limit": 2, "seed": None, "task_ids": None}
    # nested values stay as given: an endpoint without a name gets the engine's default name, not None
    replay = resolve("engine", "agentbatch.engines.replay:build_replay_workers").validate(
        {"endpoints": [{"base_url": "http://127.0.0.1:1/v1", "model": "m"}]})
    assert replay["endpoints"] == [{"base_url": "http://127.0.0.1:1/v1", "model": "m"}]
    assert replay["timeout_s"] == 600.0 and replay["workers"] == 1


def test_builtin_kinds_are_entry_points_of_agentbatch_itself() -> None:
    from agentbatch.engines.registry import ENGINES
    from agentbatch.environments.registry import WORKLOADS
    from agentbatch.scheduling.registry import BUILTIN_POLICIES

    assert {k: v for k, v in registered("workload").items() if k in WORKLOADS} == WORKLOADS
    assert {k: v for k, v in registered("engine").items() if k in ENGINES} == ENGINES
    assert {k: v for k, v in registered("policy").items() if k in BUILTIN_POLICIES} == BUILTIN_POLICIES


def test_unknown_and_broken_kinds_say_what_was_expected() -> None:
    with pytest.raises(PluginError, match="agentbatch.workloads"):
        resolve("workload", "nope")
    with pytest.raises(PluginError, match="cannot import"):
        resolve("engine", "no_such_package.x:Engine")
    with pytest.raises(PluginError, match="has no 'Missing'"):
        resolve("policy", "toolbench.policy:Missing")
    with pytest.raises(PluginError, match="not a queue policy"):
        policy_plugin("queue", "toolbench_fewest_steps")  # a priority policy where a queue is expected


def test_plugin_policy_and_engine_params_are_checked_in_the_one_pass() -> None:
    base = {"workload": {"kind": "toolbench"}}
    ok = validate_config({**base, "scheduling": {"priority": {"name": "toolbench_fewest_steps",
                                                              "params": {"ceiling": 5}}},
                          "engine": {"kind": "toolbench_lazy", "params": {"workers": 2}}})
    spec = ok.policy("priority")
    assert spec.name.__name__ == "FewestStepsFirst" and spec.params == {"ceiling": 5}
    with pytest.raises(ConfigError) as err:
        validate_config({**base, "scheduling": {"priority": {"name": "toolbench_fewest_steps",
                                                             "params": {"ceiling": "5"}}},
                         "engine": {"kind": "toolbench_lazy", "params": {"workers": 0, "answr": "x"}}})
    fields = {i.field for i in err.value.issues}
    assert fields == {"scheduling.priority.params.ceiling", "engine.params.workers", "engine.params.answr"}


def test_ground_truth_with_final_text_drives_the_scripted_engine() -> None:
    from agentbatch.protocols.engine import ChatRequest

    workload = make_workload("toolbench", {"tasks_per_suite": 1, "suites": ["notes"]})
    task = workload.tasks()[0]
    assert task.group == "notes"
    turns = ground_truth_turns(workload.ground_truth(task))
    assert turns[1] == GroundTruthTurn([{"name": "note_read", "arguments": {"key": "k0"}}], task.data["answer"])
    engine = make_engines("scripted", {"timing": {"kind": "token", "scale": 0.0}}, workload)[0]

    async def play() -> tuple[dict, list[dict]]:
        env = workload.create(task)
        reset = await env.reset(task)
        messages = list(reset.messages)
        for i in range(20):
            res = await engine.complete(ChatRequest(messages, reset.tools, task_id=task.task_id, step_index=i))
            messages.append(res.message)
            out = await env.step(res.message)
            messages.extend(out.messages)
            if out.done:
                break
        return await env.score(), messages

    result, messages = asyncio.run(play())
    assert result["score"] == 1.0 and result["final"] == task.data["answer"]
    assert [m["content"] for m in messages if m["role"] == "assistant" and not m.get("tool_calls")] == \
        ["saved", task.data["answer"]]


def test_restore_gets_assistant_and_recorded_results_pairs() -> None:
    workload = make_workload("toolbench", {"tasks_per_suite": 1, "suites": ["notes"]})
    task = workload.tasks()[0]

    async def main() -> dict:
        env = workload.create(task)
        await env.reset(task)
        write = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "note_write", "arguments": json.dumps({"key": "k0", "text": task.data["text"]})}}]}
        await env.restore([RecordedTurn(write, [{"role": "tool", "tool_call_id": "c", "content": "ok"}]),
                           RecordedTurn({"role": "assistant", "content": "saved"}, [])])
        assert env.turn == 1 and env.notes == {"k0": task.data["text"]}
        await env.step({"role": "assistant", "content": task.data["text"]})
        return await env.score()

    assert asyncio.run(main())["score"] == 1.0


def test_plugins_line_says_what_kinds_resolve_to_and_never_raises() -> None:
    from agentbatch.flows.stored_plugins import plugins_line

    line = plugins_line({"workload": {"kind": "toolbench"}, "engine": {"kind": "scripted"}})
    assert "workload toolbench -> toolbench.workload:ToolBench" in line
    assert "engine scripted -> agentbatch.engines.scripted:build_scripted_workers" in line
    gone = plugins_line({"workload": {"kind": "uninstalled_pkg.mod:Bench"}, "engine": "garbage"})
    assert "workload uninstalled_pkg.mod:Bench -> NOT RESOLVABLE here" in gone
