"""The "bash_tasks" workload: fix a tiny repository in a Docker sandbox with the `bash` tool.

Each sample gets a container of the workload's `DockerPool` with the task's repo in
`<workdir>/repo`; the score is 1.0 when the task's test passes in that container at the end.
`TaskSpec.data["ground_truth"]` holds the `bash` calls that solve the task, as one user turn (a list
with one list of calls), for the scripted engine.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from agentbatch.environments.bash_tasks import catalog
from agentbatch.environments.docker_env import DockerEnvironment
from agentbatch.environments.docker_pool import DockerPool, Sandbox, SandboxSettings
from agentbatch.protocols.environment import TaskSpec
from agentbatch.protocols.plugins import PluginParams

REPO_DIR = "repo"


class BashTaskEnvironment(DockerEnvironment):
    @property
    def repo(self) -> str:
        return f"{self.pool.settings.workdir}/{REPO_DIR}"

    def initial_messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "You are a careful software engineer working in a Linux sandbox."},
            {"role": "user", "content": str(self.task.data["prompt"])},
        ]

    async def prepare(self, sandbox: Sandbox) -> None:
        files = {f"{REPO_DIR}/{rel}": content for rel, content in self.task.data["files"].items()}
        await self.pool.put_files(sandbox, files)

    async def exec(self, command: str, timeout_s: float | None = None):
        # Every command starts in the repo, as the prompt says.
        return await super().exec(f"cd {shlex.quote(self.repo)} && {{ {command}\n}}", timeout_s)

    async def score(self) -> dict[str, Any]:
        res = await self.exec_checked(str(self.task.data["test"]))
        tail = (res.stdout + res.stderr)[-2000:]
        return {
            "score": 1.0 if res.ok else 0.0,
            "test_exit_code": res.exit_code,
            "test_output": tail,
            "replacements": self.replacements,
        }


class BashTasksParams(PluginParams):
    tasks: list[str] | None = Field(None, min_length=1, description="task ids (default: all shipped)")
    repeats: int = Field(1, ge=1, le=100_000, description="samples per task")
    image: str | None = Field(None, min_length=1)
    hosts: list[str | None] | None = Field(None, min_length=1, description="Docker hosts (None: local)")
    max_containers: int | None = Field(None, ge=1)
    max_exec: int | None = Field(None, ge=1)
    sandbox: dict[str, Any] | None = None
    command_timeout_s: float = Field(60.0, gt=0, le=86400)
    step_timeout_s: float | None = Field(300.0, gt=0, le=86400)
    batch_label: str | None = Field(None, min_length=1, max_length=100)


class BashTasksWorkload:
    """Factory of the bash_tasks workload (`workload.params` are its keyword arguments).

    tasks: task ids to use (default: all shipped ones); repeats: samples per task.
    image, hosts, max_containers, max_exec: see `DockerPool`; sandbox: other `SandboxSettings`
    fields (network, memory, cpus, pids_limit, workdir_mount ...).
    command_timeout_s: each bash command's own limit (a timeout is an observation);
    step_timeout_s: the whole environment step's limit (passing it is an infrastructure failure).
    batch_label: the `agentbatch.batch` label of the containers (default: a fresh id).
    """

    name = "bash_tasks"
    Params = BashTasksParams

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        repeats: int = 1,
        image: str | None = None,
        hosts: Sequence[str | None] | None = None,
        max_containers: int | None = None,
        max_exec: int | None = None,
        sandbox: dict[str, Any] | None = None,
        command_timeout_s: float = 60.0,
        step_timeout_s: float | None = 300.0,
        batch_label: str | None = None,
    ) -> None:
        known = catalog.by_id()
        ids = list(tasks) if tasks is not None else list(known)
        missing = [t for t in ids if t not in known]
        if missing:
            raise ValueError(f"bash_tasks: unknown task ids {missing}; shipped: {sorted(known)}")
        if repeats < 1:
            raise ValueError("bash_tasks: repeats must be >= 1")
        self._tasks = [known[t] for t in ids]
        self.repeats = repeats
        settings = dict(sandbox or {})
        if image:
            settings["image"] = image
        self.pool = DockerPool(
            SandboxSettings.from_params(settings),
            hosts=list(hosts) if hosts else [None],
            max_containers=max_containers,
            max_exec=max_exec,
            batch_label=batch_label,
        )
        self.command_timeout_s = command_timeout_s
        self.step_timeout_s = step_timeout_s
        self._created = 0

    def tasks(self) -> list[TaskSpec]:
        out = []
        for _ in range(self.repeats):
            for t in self._tasks:
                out.append(TaskSpec(task_id=t["id"], data=task_data(t)))
        return out

    def create(self, task: TaskSpec) -> BashTaskEnvironment:
        self._created += 1
        return BashTaskEnvironment(
            self.pool,
            task,
            command_timeout_s=self.command_timeout_s,
            step_timeout_s=self.step_timeout_s,
            sample_key=f"{task.task_id}-{self._created}",
        )

    async def aclose(self) -> None:
        await self.pool.aclose()  # also removes leftovers of this batch label


def task_data(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": catalog.prompt_of(task),
        "files": dict(task["files"]),
        "test": catalog.TEST_CMD,
        # One user turn, so one list with every call (the scripted engine sends them calls_per_step at
        # a time, then a plain answer that ends the sample).
        "ground_truth": [
            [{"name": "bash", "arguments": {"command": cmd}} for turn in task["ground_truth"] for cmd in turn]
        ],
    }
