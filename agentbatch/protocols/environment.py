"""The environment interface: reset for a task, execute an assistant turn, score at the end.

Every inference step is followed by one environment step. If the assistant message carries tool
calls, the environment executes them and returns one tool message per call. If it carries none,
the environment advances the conversation (next user turn) or says the sample is done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from agentbatch.protocols.engine import Message, ToolSchema

RestoreMode = Literal["replay", "external"]
RESTORE_MODES: tuple[RestoreMode, ...] = ("replay", "external")


@dataclass(slots=True)
class TaskSpec:
    """One task of a workload, as stored with the sample.

    `group` is the task's suite or category (e.g. "multi_turn_base"): scores are broken down by it
    in `status`, the report and comparisons. Empty: no group.
    """

    task_id: str
    data: dict[str, Any] = field(default_factory=dict)  # workload-specific, JSON-serialisable
    group: str = ""


class RecordedTurn(NamedTuple):
    """One completed assistant turn and the messages its environment step answered with (the recorded
    tool results and/or next user message), as `Environment.restore` receives them on resume."""

    assistant: Message
    results: list[Message]


@dataclass(slots=True)
class GroundTruthTurn:
    """One user turn of a task's reference solution: the tool calls ({"name", "arguments"}) in order,
    then the final text the assistant answers with (None: any text; the scripted engine says "Done.")."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    final_text: str | None = None


def ground_truth_turns(raw: Iterable[Any]) -> list[GroundTruthTurn]:
    """Normalise a ground truth: each turn a `GroundTruthTurn`, a list of calls, or a mapping
    {"calls": [...], "final_text": "..."}."""
    turns = []
    for i, turn in enumerate(raw):
        if isinstance(turn, GroundTruthTurn):
            turns.append(turn)
        elif isinstance(turn, Mapping):
            unknown = set(turn) - {"calls", "final_text"}
            if unknown:
                raise ValueError(f"ground truth turn {i}: unknown keys {sorted(unknown)}; expected calls, final_text")
            turns.append(GroundTruthTurn(list(turn.get("calls") or []), turn.get("final_text")))
        elif isinstance(turn, Sequence) and not isinstance(turn, str):
            turns.append(GroundTruthTurn(list(turn)))
        else:
            raise ValueError(f"ground truth turn {i}: expected a list of calls or {{calls, final_text}}, "
                             f"got {type(turn).__name__}")
    return turns


@dataclass(slots=True)
class EnvReset:
    tools: list[ToolSchema]
    messages: list[Message]  # initial messages (system and first user turn)


@dataclass(slots=True)
class EnvResult:
    messages: list[Message]  # tool results and/or the next user message
    done: bool = False
    tool_calls: int = 0  # how many tool calls were executed
    tool_errors: int = 0  # calls whose result was an error observation (not a failure)
    info: dict[str, Any] = field(default_factory=dict)


class EnvironmentFailure(Exception):
    """An infrastructure failure of the environment (not a tool error): the step may be retried
    (`protocols/retry.py`)."""


class EnvironmentUnreachable(EnvironmentFailure):
    """The call never reached the environment (no connection, server not running): retrying it
    cannot apply a side effect twice."""


@runtime_checkable
class Environment(Protocol):
    """One sample's environment instance. Created per sample by an `EnvironmentFactory`.

    Two declared attributes (read with `restore_mode_of` / `is_blocking`, which apply the defaults
    for environments that do not declare them):

    - `restore_mode`: "replay" (default) — state lives in this instance; on resume a fresh instance
      re-executes the recorded turns to rebuild it. "external" — state lives elsewhere (a remote
      server, a database); `restore` must reattach to it and never re-execute a call.
    - `blocking`: True when `reset`/`step`/`score` do synchronous work (CPU or blocking I/O) inside
      their coroutines; the runner then runs them in worker threads instead of the event loop.
    """

    restore_mode: RestoreMode
    blocking: bool

    async def reset(self, task: TaskSpec) -> EnvReset: ...

    async def step(self, assistant: Message) -> EnvResult: ...

    async def restore(self, pairs: list[RecordedTurn]) -> None:
        """Bring a fresh instance (after `reset`) to the state after the recorded turns (resume).

        Each pair is a completed assistant message and the messages its environment step returned.
        The recorded observations are reused as they are; this only rebuilds internal state
        ("replay") or reattaches to it ("external").
        """
        ...

    async def score(self) -> dict[str, Any]:
        """Final result; must contain "score" (float in [0, 1]) and may add details."""
        ...

    async def close(self) -> None: ...


class EnvironmentFactory(Protocol):
    """Makes the environments of one workload and lists its tasks.

    Optional: `ground_truth(task) -> list of GroundTruthTurn` (or of lists of calls), the reference
    solution the scripted engine answers with (see `GroundTruthSource`); `check() -> None`, called
    before a batch is written: everything the workload can verify up front (servers reachable, tool
    names its settings use), raising ValueError that starts with the parameter at fault;
    `absolute_params(params, base) -> params` (a static method), the params with relative paths made
    absolute against the folder the config was loaded in, before the config is stored.
    """

    name: str

    def tasks(self) -> list[TaskSpec]: ...

    def create(self, task: TaskSpec) -> Environment: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class GroundTruthSource(Protocol):
    """A workload that knows each task's reference solution."""

    def ground_truth(self, task: TaskSpec) -> Sequence[Any]: ...


def restore_mode_of(env: Any) -> RestoreMode:
    """The environment's declared restore mode ("replay" when it declares none)."""
    mode = getattr(env, "restore_mode", "replay")
    if mode not in RESTORE_MODES:
        raise ValueError(f"{type(env).__name__}.restore_mode: expected one of {RESTORE_MODES}, got {mode!r}")
    return mode


UNSAFE_CALLS = "unsafe_calls"  # key of an external step's request: its calls a resume must not run blindly
IN_FLIGHT_STOPPED = "stopped in flight: "  # error of a sample stopped for a check (`retry` holds it)


def unsafe_calls(env: Any, assistant: Mapping[str, Any]) -> list[str]:
    """The calls of an external-state step that running again after a crash could repeat: the
    environment's `unsafe_calls(assistant)` when it has one, else every call (it cannot tell)."""
    own = getattr(env, "unsafe_calls", None)
    if own is not None:
        return list(own(assistant))
    return [str((c.get("function") or {}).get("name", "?")) for c in assistant.get("tool_calls") or []] or ["step"]


def is_blocking(env: Any) -> bool:
    """Whether the environment declared synchronous (blocking) code: run it in worker threads."""
    return bool(getattr(env, "blocking", False))


def recorded_turns(assistants: Sequence[Message], results: Sequence[list[Message]]) -> list[RecordedTurn]:
    return [RecordedTurn(a, list(r)) for a, r in zip(assistants, results, strict=True)]
