"""One sample's Docker sandbox environment, with a single `bash` tool.

The sample holds one container of a `DockerPool` from `reset` to `close`. Each tool call runs as
one `exec` in it; a non-zero exit code or a command timeout is an observation the model sees (and
counts in `EnvResult.tool_errors`), not a failure.

Faults: when a step fails for infrastructure reasons (the container died or was killed, a Docker
API error, the whole step passed `step_timeout_s`), the environment replaces the container at once,
rebuilds the sample's state by re-running the commands of its completed assistant turns (its own
history) in the fresh one, and raises `EnvironmentFailure`, so the flow records the failed attempt
and retries the step against the rebuilt sandbox. `score` instead rebuilds and retries once by itself
(it has no observation to record). `restore` rebuilds the same way after a resume.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from agentbatch.environments.docker_pool import DockerPool, ExecResult, Sandbox
from agentbatch.protocols.engine import Message, ToolSchema
from agentbatch.protocols.environment import (
    EnvironmentFailure,
    EnvReset,
    EnvResult,
    RecordedTurn,
    RestoreMode,
    TaskSpec,
)

log = logging.getLogger(__name__)

BASH_TOOL: ToolSchema = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the sandbox (working directory is the repository). "
        "Returns stdout, stderr and the exit code. There is no network.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command to run"}},
            "required": ["command"],
        },
    },
}


def tool_calls_of(assistant: Message) -> list[tuple[str, str, dict[str, Any] | None, str | None]]:
    """(call id, tool name, arguments or None, parse error) for each tool call of an assistant message."""
    out = []
    for i, call in enumerate(assistant.get("tool_calls") or []):
        fn = call.get("function") or call  # OpenAI format, or the bare {"name", "arguments"}
        raw = fn.get("arguments")
        args: dict[str, Any] | None
        error = None
        if isinstance(raw, dict):
            args = raw
        else:
            try:
                args = json.loads(raw or "{}")
                if not isinstance(args, dict):
                    args, error = None, f"arguments must be a JSON object, got {type(args).__name__}"
            except json.JSONDecodeError as exc:
                args, error = None, f"arguments are not valid JSON: {exc}"
        out.append((call.get("id") or f"call_{i}", fn.get("name", ""), args, error))
    return out


def format_observation(res: ExecResult, timeout_s: float) -> str:
    parts = [res.stdout] if res.stdout else []
    if res.stderr:
        parts.append(f"[stderr]\n{res.stderr}")
    if res.truncated:
        parts.append("[output truncated]")
    if res.timed_out:
        parts.append(f"[command timed out after {timeout_s:g} s]")
    parts.append(f"[exit code {res.exit_code}]")
    return "\n".join(p.rstrip("\n") for p in parts)


class DockerEnvironment:
    """A sample's sandbox. Subclasses say what goes in it (`prepare`) and how it is scored (`score`)."""

    restore_mode: RestoreMode = "replay"  # a fresh container re-runs the recorded commands
    blocking = False  # the pool runs the Docker SDK's calls in threads

    def __init__(
        self,
        pool: DockerPool,
        task: TaskSpec,
        *,
        command_timeout_s: float = 60.0,
        step_timeout_s: float | None = None,
        sample_key: str | None = None,
    ) -> None:
        self.pool = pool
        self.task = task
        self.command_timeout_s = command_timeout_s
        self.step_timeout_s = step_timeout_s
        self.sample_key = sample_key or task.task_id
        self.sandbox: Sandbox | None = None
        self.history: list[Message] = []  # assistant messages whose steps completed
        self.replacements = 0
        self.commands_run = 0
        self._dirty = False  # a turn half-ran (cancelled): rebuild before the next action

    # --- hooks ---------------------------------------------------------------------------

    def tools(self) -> list[ToolSchema]:
        return [BASH_TOOL]

    def initial_messages(self) -> list[Message]:
        return [{"role": "user", "content": str(self.task.data.get("prompt", ""))}]

    async def prepare(self, sandbox: Sandbox) -> None:
        """Put the task's files into a fresh sandbox (before any command runs)."""

    async def score(self) -> dict[str, Any]:
        return {"score": 0.0}

    # --- protocol ------------------------------------------------------------------------

    async def reset(self, task: TaskSpec) -> EnvReset:
        self.task = task
        self.history = []
        await self._fresh_sandbox()
        return EnvReset(tools=self.tools(), messages=self.initial_messages())

    async def step(self, assistant: Message) -> EnvResult:
        calls = tool_calls_of(assistant)
        if not calls:  # a plain answer ends the sample: there is one user turn
            self.history.append(assistant)
            return EnvResult(messages=[], done=True)
        await self._ensure_sandbox()
        self._dirty = True  # until the turn completes: a cancelled step (the flow's timeout) leaves it dirty
        try:
            if self.step_timeout_s is not None:
                result = await asyncio.wait_for(self._run_calls(calls), self.step_timeout_s)
            else:
                result = await self._run_calls(calls)
            self._dirty = False
        except (EnvironmentFailure, TimeoutError) as exc:
            reason = (
                f"environment step passed {self.step_timeout_s:g} s" if isinstance(exc, TimeoutError) else str(exc)
            )
            # Commands of this turn may have half-run: rebuild from the completed turns only.
            await self._rebuild(reason)
            raise EnvironmentFailure(f"{reason}; sandbox replaced and rebuilt from {len(self.history)} turn(s)") from exc
        self.history.append(assistant)
        return result

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        assistants = [assistant for assistant, _ in pairs]
        self.history = list(assistants)
        try:
            if self.sandbox is None or self.commands_run:
                await self._fresh_sandbox()
            await self._replay(assistants)
        except EnvironmentFailure as exc:
            await self._rebuild(f"restore failed: {exc}")  # one more try; raises if that fails too

    async def close(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            await self.pool.remove(sandbox)

    # --- internals -----------------------------------------------------------------------

    async def exec_checked(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a command outside a step (e.g. the scoring test): rebuild and retry once on failure."""
        await self._ensure_sandbox()
        try:
            return await self.exec(command, timeout_s)
        except EnvironmentFailure as exc:
            await self._rebuild(str(exc))
            return await self.exec(command, timeout_s)

    async def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        if self.sandbox is None:
            raise EnvironmentFailure(f"sample {self.sample_key}: no sandbox (reset not called or closed)")
        self.commands_run += 1
        return await self.pool.exec(self.sandbox, command, timeout_s=timeout_s or self.command_timeout_s)

    async def _run_calls(self, calls) -> EnvResult:
        messages: list[Message] = []
        errors = 0
        exec_s = 0.0
        for call_id, name, args, parse_error in calls:
            if name != "bash":
                content, is_error = f"error: unknown tool {name!r}; the only tool is 'bash'", True
            elif parse_error or not isinstance((args or {}).get("command"), str):
                content, is_error = f"error: {parse_error or 'missing string argument command'}", True
            else:
                res = await self.exec(args["command"])
                exec_s += res.duration_s
                content, is_error = format_observation(res, self.command_timeout_s), not res.ok
            errors += is_error
            messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
        return EnvResult(
            messages=messages,
            tool_calls=len(calls),
            tool_errors=errors,
            info={"exec_s": round(exec_s, 6), "sandbox": self.sandbox.name if self.sandbox else None},
        )

    async def _replay(self, assistants: list[Message]) -> None:
        for assistant in assistants:
            for _, name, args, error in tool_calls_of(assistant):
                command = (args or {}).get("command")
                if name == "bash" and not error and isinstance(command, str):
                    await self.exec(command)

    async def _fresh_sandbox(self) -> None:
        if self.sandbox is None:
            self.sandbox = await self.pool.start(self.sample_key)
        else:
            self.sandbox = await self.pool.replace(self.sandbox)
        await self.prepare(self.sandbox)

    async def _rebuild(self, reason: str, *, count: bool = True) -> None:
        """Replace the sandbox and re-run the completed turns; on failure leave none (slot freed)."""
        if count:
            self.replacements += 1
            log.warning("sample %s: %s; replacing its sandbox", self.sample_key, reason)
        try:
            await self._fresh_sandbox()
            await self._replay(self.history)
            self._dirty = False
        except BaseException:
            if self.sandbox is not None and not self.sandbox.removed:
                await self.pool.remove(self.sandbox)
            self.sandbox = None
            raise

    async def _ensure_sandbox(self) -> None:
        if self.sandbox is None:  # an earlier rebuild failed: try again from the history
            await self._rebuild("", count=False)
        elif self._dirty:  # the previous step was cancelled half-way
            await self._rebuild("previous step was cancelled mid-way")
