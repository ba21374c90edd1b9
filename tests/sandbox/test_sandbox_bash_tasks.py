"""The shipped bash_tasks: every repo's test fails as shipped and passes after its ground-truth
commands, run in real sandboxes; the task data has the shape the scripted engine reads."""

from __future__ import annotations

import asyncio

import pytest

from agentbatch.environments.bash_tasks import catalog
from agentbatch.environments.bash_tasks.workload import BashTasksWorkload
from agentbatch.environments.registry import make_workload


def test_catalog_shape() -> None:
    wl = BashTasksWorkload(repeats=2)
    tasks = wl.tasks()
    assert len(catalog.TASKS) >= 10 and len(tasks) == 2 * len(catalog.TASKS)
    assert len({t["id"] for t in catalog.TASKS}) == len(catalog.TASKS)
    for t in tasks:
        gt = t.data["ground_truth"]
        assert gt and all(c["name"] == "bash" and isinstance(c["arguments"]["command"], str) for turn in gt for c in turn)
        assert any(name.startswith("test_") for name in t.data["files"])
    with pytest.raises(ValueError, match="unknown task ids"):
        BashTasksWorkload(tasks=["no-such-task"])


def test_export_writes_the_repos(tmp_path) -> None:
    catalog.export(tmp_path)
    assert (tmp_path / "last-n" / "seq.py").read_text() == catalog.by_id()["last-n"]["files"]["seq.py"]


@pytest.mark.docker
def test_ground_truth_solves_every_task(batch_label: str) -> None:
    async def play(wl, task):
        env = wl.create(task)
        try:
            reset = await env.reset(task)
            before = await env.score()
            errors = 0
            for i, turn in enumerate(task.data["ground_truth"]):
                msg = {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"t{i}c{j}", "type": "function",
                     "function": {"name": c["name"], "arguments": c["arguments"]}} for j, c in enumerate(turn)]}
                errors += (await env.step(msg)).tool_errors
            end = await env.step({"role": "assistant", "content": "Fixed."})
            after = await env.score()
            return reset, before, after, end, errors
        finally:
            await env.close()

    async def main():
        wl = make_workload("bash_tasks", {"batch_label": batch_label, "max_containers": 6, "max_exec": 4})
        try:
            return wl.tasks(), await asyncio.gather(*(play(wl, t) for t in wl.tasks()))
        finally:
            await wl.aclose()

    tasks, results = asyncio.run(main())
    for task, (reset, before, after, end, errors) in zip(tasks, results, strict=True):
        assert [t["function"]["name"] for t in reset.tools] == ["bash"]
        assert reset.messages[-1]["role"] == "user" and task.data["prompt"] in reset.messages[-1]["content"]
        assert before["score"] == 0.0, task.task_id  # the bug is real
        assert after["score"] == 1.0, (task.task_id, after["test_output"])
        assert end.done and errors == 0, task.task_id
