"""Faults of Docker sandboxes: a tool error is an observation; a container killed from outside, a
step past its time limit and a Docker error raise EnvironmentFailure after the sandbox is replaced
and rebuilt from the sample's own history, so the retried step continues where it was; resume
rebuilds by re-running the recorded commands; nothing is left behind after a failed batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from agentbatch.environments.bash_tasks.workload import BashTasksWorkload
from agentbatch.environments.docker_pool import SandboxDied, list_labelled
from agentbatch.protocols.environment import EnvironmentFailure, RecordedTurn

pytestmark = pytest.mark.docker
T = TypeVar("T")


def assistant(*commands: str, name: str = "bash") -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": {"command": c}}}
            for i, c in enumerate(commands)
        ],
    }


def workload(label: str, **kw) -> BashTasksWorkload:
    return BashTasksWorkload(tasks=["last-n"], batch_label=label, max_containers=4, **kw)


def in_sandbox(label: str, body: Callable[[Any], Awaitable[T]], **kw) -> T:
    """Run `body(env)` on one reset sample environment of the workload, then close it all."""

    async def main() -> T:
        wl = workload(label, **kw)
        task = wl.tasks()[0]
        env = wl.create(task)
        try:
            await env.reset(task)
            return await body(env)
        finally:
            await env.close()
            await wl.aclose()

    return asyncio.run(main())


def test_tool_errors_are_observations(batch_label: str) -> None:
    async def body(env):
        failing = await env.step(assistant("false", "ls no-such-file", "echo fine"))
        unknown = await env.step(assistant("x", name="python"))
        bad_args = await env.step({"role": "assistant", "tool_calls": [
            {"id": "z", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]})
        return failing, unknown, bad_args

    failing, unknown, bad_args = in_sandbox(batch_label, body)
    assert (failing.tool_calls, failing.tool_errors, failing.done) == (3, 2, False)
    assert "[exit code 1]" in failing.messages[0]["content"]
    assert "No such file" in failing.messages[1]["content"] and failing.messages[2]["content"].startswith("fine")
    assert [m["tool_call_id"] for m in failing.messages] == ["c0", "c1", "c2"]
    assert unknown.tool_errors == 1 and "unknown tool" in unknown.messages[0]["content"]
    assert bad_args.tool_errors == 1 and "not valid JSON" in bad_args.messages[0]["content"]


def test_killed_container_is_replaced_and_rebuilt(docker_client, batch_label: str) -> None:
    async def body(env):
        await env.step(assistant("echo turn1 > marker", "sed -i 's/xs\\[-n - 1:\\]/xs[-n:]/' seq.py"))
        first = env.sandbox.id
        docker_client.api.kill(first)  # from outside, between steps
        with pytest.raises(EnvironmentFailure, match="gone"):
            await env.step(assistant("cat marker"))
        second = env.sandbox.id
        retried = await env.step(assistant("cat marker"))  # the flow's retry of the same step
        score = await env.score()
        # killed in the middle of a command this time
        killer = threading.Timer(1.0, docker_client.api.kill, args=(second,))
        killer.start()
        with pytest.raises(EnvironmentFailure):
            await env.step(assistant("sleep 20"))
        killer.join()
        third = env.sandbox.id
        after = await env.score()
        return first, second, third, retried, score, after, env.replacements

    first, second, third, retried, score, after, replacements = in_sandbox(batch_label, body)
    assert len({first, second, third}) == 3
    assert retried.messages[0]["content"].startswith("turn1")  # state rebuilt from the history
    assert score["score"] == 1.0 and after["score"] == 1.0 and replacements == 2
    assert list_labelled(docker_client, batch_label) == []


def test_step_timeout_rebuilds_from_completed_turns(batch_label: str) -> None:
    async def body(env):
        await env.step(assistant("echo kept > a"))
        with pytest.raises(EnvironmentFailure, match="passed 2 s"):
            await env.step(assistant("echo lost > b", "sleep 30"))
        return await env.step(assistant("cat a; ls b"))

    res = in_sandbox(batch_label, body, step_timeout_s=2.0)
    assert res.messages[0]["content"].startswith("kept")  # turn 1 re-run in the fresh sandbox
    assert "No such file" in res.messages[0]["content"]  # the timed-out turn's half is gone


def test_cancelled_step_is_rebuilt_before_the_retry(batch_label: str) -> None:
    async def body(env):
        with pytest.raises(TimeoutError):  # the flow's own step timeout cancels the step
            await asyncio.wait_for(env.step(assistant("echo half >> log", "sleep 30")), 2.0)
        res = await env.step(assistant("echo half >> log", "wc -l < log"))
        return res

    res = in_sandbox(batch_label, body)
    assert res.messages[1]["content"].startswith("1")  # not 2: the half-run turn was undone


def test_restore_reruns_recorded_commands(batch_label: str) -> None:
    async def main():
        wl = workload(batch_label)
        task = wl.tasks()[0]
        turns = [assistant(*(c["arguments"]["command"] for c in t)) for t in task.data["ground_truth"]]
        env = wl.create(task)  # a resumed sample: fresh environment, recorded assistant turns
        try:
            await env.reset(task)
            before = await env.score()
            await env.restore([RecordedTurn(t, []) for t in turns])
            after = await env.score()
            end = await env.step({"role": "assistant", "content": "fixed"})
            return before, after, end
        finally:
            await env.close()
            await wl.aclose()

    before, after, end = asyncio.run(main())
    assert before["score"] == 0.0 and after["score"] == 1.0 and end.done


def test_failed_batch_leaves_no_container(docker_client, batch_label: str) -> None:
    async def main():
        wl = BashTasksWorkload(batch_label=batch_label, max_containers=4)
        envs = [wl.create(t) for t in wl.tasks()[:4]]
        try:
            await asyncio.gather(*(e.reset(e.task) for e in envs))
            assert len(list_labelled(docker_client, batch_label)) == 4
            raise RuntimeError("the batch crashes with samples in flight")
        finally:
            await wl.aclose()  # the flow calls this in its finally

    with pytest.raises(RuntimeError, match="crashes"):
        asyncio.run(main())
    assert list_labelled(docker_client, batch_label) == []


def test_exec_the_runtime_cannot_start_is_a_failure_not_an_observation(batch_label: str) -> None:
    """An exec the runtime never started (exit status 126, process id 0: what an exec racing a
    container kill gets, and an exec as an unknown user) is a failure, never a tool result; a
    command's own 126 (not executable) stays an observation."""

    async def body(env):
        own = await env.pool.exec(env.sandbox, "printf 'echo hi' > s.sh && ./s.sh")
        with pytest.raises(EnvironmentFailure, match="could not start") as caught:
            await env.pool.exec(env.sandbox, "true", user="no-such-user")
        return own, caught.value

    own, failure = in_sandbox(batch_label, body)
    assert own.exit_code == 126 and "Permission denied" in own.stderr
    assert not isinstance(failure, SandboxDied)  # the container is alive: only the exec never started
