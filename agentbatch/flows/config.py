"""Batch configuration: a YAML or TOML file validated whole, in one pass, before anything is written.

The schema (`BatchConfig`) is strict: an unknown key, a wrong type (`true` for an integer, "3" for a
number), a number out of range or not finite, an empty file are refused. The kinds it names — the
workload, the engine and the four scheduling policies — are resolved through the plugin resolver
(`agentbatch.protocols.plugins`: a registered name, an entry point, or "package.module:Object") and
their `params` checked against each plugin's parameter model. Every problem is reported with the
file and the dotted path of the field (`workload.params.limit`), as `ConfigError`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentbatch.protocols import strict_yaml
from agentbatch.protocols.plugins import Plugin, PluginError, resolve
from agentbatch.protocols.retry import RetryPolicy
from agentbatch.scheduling.admission_order import AdmissionOrder
from agentbatch.scheduling.defaults import DEFAULTS, AdmissionControl

if TYPE_CHECKING:
    from agentbatch.scheduling.registry import PolicySpec

MAX_NAME_LENGTH = 200  # the store's name columns (PostgreSQL VARCHAR(200))
MAX_CONFIG_BYTES = 16 * 1024 * 1024
SKIP_PLUGINS = "skip_plugins"  # validation context key: schema only (the plugins are checked after)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _printable(value: str) -> str:
    if any(not ch.isprintable() for ch in value):
        raise ValueError("must not contain control characters")
    return value


class WorkloadConfig(_Strict):
    kind: str = Field("bfcl", min_length=1, max_length=MAX_NAME_LENGTH,
                      description="workload: a registered name (bfcl, bash_tasks, mcp, recorded, or an installed "
                      "plugin's entry point) or 'package.module:Object'; see docs/plugins.md")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="the workload's parameters (checked against its parameter model)")


class EngineConfig(_Strict):
    kind: str = Field("scripted", min_length=1, max_length=MAX_NAME_LENGTH,
                      description="engine: scripted, openai, replay, an installed plugin's entry point, or "
                      "'package.module:Object'")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the engine's parameters, e.g. workers, timing, endpoints (checked against its model)",
    )


class PolicyConfig(_Strict):
    """A scheduling policy as a config file names it; `BatchConfig.policy` resolves it to a `PolicySpec`."""

    name: str = Field("fifo", min_length=1, max_length=MAX_NAME_LENGTH,
                      description="a registered policy name or 'package.module:Object'")
    params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters")


class ReplanConfig(_Strict):
    every: float = Field(
        0.1, ge=0, le=1,
        description="checkpoint interval as a share of the chosen policy's predicted makespan; 0: no re-planning",
    )
    margin: float = Field(0.02, ge=0, lt=1, description="the mean predicted gain a switch needs (none predicted slower)")


class SchedulingConfig(_Strict):
    # Every default comes from agentbatch.scheduling.defaults (shared with `replay` and virtual time).
    max_active_samples: int = Field(DEFAULTS.max_active_samples, ge=1, le=1_000_000,
                                    description="samples admitted at once (reference concurrency)")
    env_slots: int = Field(DEFAULTS.env_slots, ge=1, le=1_000_000, description="environment actions running at once")
    per_worker_inflight: int = Field(DEFAULTS.per_worker_inflight, ge=1, le=1_000_000,
                                     description="inference requests in flight per engine worker")
    env_slots_scope: Literal["process", "batch"] = Field(
        "process",
        description="process: env_slots per process driving the batch (each machine's own sandboxes); "
        "batch: env_slots for the whole batch, split among the processes that drive it (join, concurrent "
        "resume) and rebalanced at each lease renewal (a shared sandbox cluster or a tool API's rate limit)",
    )
    coupled: bool = Field(DEFAULTS.coupled, description="baseline: a sample holds an environment slot while admitted")
    admission_order: AdmissionOrder = Field(
        DEFAULTS.admission_order,
        description="order samples are admitted in: as listed, or longest recorded chain (earlier batches "
        "of the same task ids) first, unknown ones after, or only the longest tenth first and the rest as "
        "listed, or kv_balanced: longest first while the contexts the admitted chains reach fit in the "
        "engines' KV cache (virtual time with context priors; run has none yet and orders longest first); "
        "the same as arrival when there is no history",
    )
    admission_control: AdmissionControl = Field(
        DEFAULTS.admission_control,
        description="adaptive: the admission limit starts at max_active_samples and follows the engines' "
        "measured pressure (backs off on KV thrash, grows back while the GPU idles; above the start only "
        "once as many samples as the start have finished with almost no recompute, where the engines "
        "export recomputed tokens: serve-sim workers and virtual time); static: it stays at max_active_samples. Ignored when coupled",
    )
    # Defaults are the coordination policies (the ablation in docs/ablation.md); the baseline is
    # coupled: true, env_queue fifo, router round_robin, priority fcfs.
    env_queue: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name=DEFAULTS.env_queue),
                                 description="order of the environment-action queue")
    inference_queue: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name=DEFAULTS.inference_queue),
                                       description="order of each worker's queue")
    router: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name=DEFAULTS.router),
                              description="which engine worker serves a sample's next inference call")
    priority: PolicyConfig = Field(
        default_factory=lambda: PolicyConfig(name=DEFAULTS.priority), description="per-request engine priority"
    )
    policy: str = Field(
        "auto", min_length=1, max_length=MAX_NAME_LENGTH,
        description="auto: before the batch, simulate every candidate of the policy portfolio (the strong "
        "baselines among them) on the batch's tasks as earlier batches recorded them, on these engines and slots, "
        "and run the best (needs the engine config's simulated timing profile and history; otherwise the fields "
        "here run as written); configured: the fields here run as written; or a candidate's name "
        "(`agentbatch whatif --policy list`). See docs/method.md",
    )
    replan: ReplanConfig = Field(
        default_factory=ReplanConfig,
        description="with policy auto chosen from at least three earlier runs: at checkpoints while the batch runs, "
        "simulate every candidate on the rest from what the batch has recorded and switch when one is predicted "
        "faster (docs/method.md)",
    )
    choice: dict[str, Any] | None = Field(
        None, description="written by policy auto: the chosen candidate, every candidate's predicted makespan, "
        "the rule and the time spent deciding (not an input)",
    )
    priors: dict[str, float] | None = Field(
        None, description="task id -> expected chain steps for history-aware policies and admission order; "
        "unset: from earlier batches in the store. Controlled replay pins them (from --priors, else none)",
    )


    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v in ("auto", "configured"):
            return v  # without importing the simulator (slow) for the common case
        from agentbatch.sim.portfolio import portfolio

        names = [c.name for c in portfolio()]
        if v not in ("auto", "configured", *names):
            raise ValueError(f"must be 'auto', 'configured' or a portfolio candidate: {', '.join(map(repr, names))}")
        return v


class LimitsConfig(_Strict):
    max_steps: int = Field(80, ge=2, le=1_000_000, description="steps (inference + environment) per sample at most")
    step_timeout_s: float = Field(600.0, gt=0, le=7 * 86400, description="an environment step taking longer fails")


class RetryConfig(_Strict):
    environment: int = Field(2, ge=0, le=100, description="retries of an environment step after an infrastructure error")
    inference: int = Field(2, ge=0, le=100, description="retries of an inference step after an engine error")
    backoff_s: float = Field(0.5, ge=0, le=3600, description="first retry delay; doubles each retry")

    def policy(self) -> RetryPolicy:
        """The retry rule these settings parametrise (`protocols/retry.py`)."""
        return RetryPolicy(environment=self.environment, inference=self.inference, backoff_s=self.backoff_s)


class ExecutionConfig(_Strict):
    mode: Literal["chains", "steps", "lean"] = Field(
        "chains",
        description="chains: one Prefect task per sample chain, every step listed in batched Prefect "
        "events (off the critical path; see docs/scale-out.md); steps: one Prefect task per step (the "
        "Prefect server records ~20-25 a second, which caps the batch); lean: no Prefect task runs, "
        "the flow run only, samples and steps in the store (the fastest)",
    )


POLICY_FIELDS: dict[str, str] = {  # scheduling field -> policy role
    "env_queue": "queue", "inference_queue": "queue", "router": "router", "priority": "priority",
}


class BatchConfig(_Strict):
    name: str = Field("batch", min_length=1, max_length=MAX_NAME_LENGTH, description="the batch's name")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)

    _check_name = field_validator("name")(classmethod(lambda cls, v: _printable(v)))

    @model_validator(mode="after")
    def _check_plugins(self, info: ValidationInfo) -> BatchConfig:
        # Built in code (the Python API, resume): fail at once, not mid-batch, naming the field.
        if not (info.context or {}).get(SKIP_PLUGINS):
            issues = check_plugins(self)
            if issues:
                raise ValueError("; ".join(i.line() for i in issues))
        return self

    def workload_plugin(self) -> Plugin:
        from agentbatch.environments.registry import workload_plugin

        return workload_plugin(self.workload.kind)

    def engine_plugin(self) -> Plugin:
        from agentbatch.engines.registry import engine_plugin

        return engine_plugin(self.engine.kind)

    def policy(self, field: str) -> PolicySpec:
        """The policy of a scheduling field (e.g. "router"): its class or factory, its checked params."""
        ref: PolicyConfig = getattr(self.scheduling, field)
        from agentbatch.scheduling.registry import PolicySpec

        plugin = policy_plugin(POLICY_FIELDS[field], ref.name)
        return PolicySpec(plugin.obj, plugin.validate(ref.params))


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: the dotted path of the field ("workload.params.limit"), what is wrong, the value."""

    field: str
    message: str
    value: Any = None
    has_value: bool = False

    def line(self) -> str:
        got = f" (got {_short(self.value)})" if self.has_value else ""
        return f"{self.field or '(top level)'}: {self.message}{got}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class ConfigError(Exception):
    """A config that cannot be used; the message names the file and every field at fault."""

    def __init__(self, message: str, issues: list[ConfigIssue] | None = None) -> None:
        super().__init__(message)
        self.issues = issues or []


def policy_plugin(role: str, name: str) -> Plugin:
    """A scheduling policy by name, checked to be of the role's base class (queue, router, priority)."""
    from agentbatch.scheduling.registry import BUILTIN_POLICIES, ROLES

    plugin = resolve("policy", name, BUILTIN_POLICIES)
    base = ROLES[role]
    if isinstance(plugin.obj, type) and not issubclass(plugin.obj, base):
        raise PluginError(f"{name!r} ({plugin.target}) is not a {role} policy (a subclass of {base.__name__})")
    return plugin


def _pydantic_issues(prefix: str, err: ValidationError) -> list[ConfigIssue]:
    out = []
    for e in err.errors():
        # Union members and validator wrappers appear in `loc` as "list[...]" / "function-after[...]".
        parts = [str(p) for p in e["loc"] if not (isinstance(p, str) and ("[" in p or "(" in p))]
        path = ".".join(p for p in [prefix, *parts] if p)
        msg = e["msg"].removeprefix("Value error, ")
        out.append(ConfigIssue(path, msg, e.get("input"), has_value=bool(e["loc"]) and "input" in e))
    return out


def _check_plugin(field: str, load: Any, params: Mapping[str, Any]) -> list[ConfigIssue]:
    try:
        plugin = load()
    except PluginError as exc:
        return [ConfigIssue(field, str(exc))]
    try:
        plugin.validate(params)
    except ValidationError as exc:
        return _pydantic_issues(field.rsplit(".", 1)[0] + ".params", exc)
    except (TypeError, ValueError) as exc:
        return [ConfigIssue(field.rsplit(".", 1)[0] + ".params", str(exc))]
    return []


def check_plugins(config: BatchConfig) -> list[ConfigIssue]:
    """Resolve every kind the config names and check each one's params."""
    issues = _check_plugin("workload.kind", config.workload_plugin, config.workload.params)
    issues += _check_plugin("engine.kind", config.engine_plugin, config.engine.params)
    for field, role in POLICY_FIELDS.items():
        ref: PolicyConfig = getattr(config.scheduling, field)
        issues += _check_plugin(f"scheduling.{field}.name", lambda r=role, n=ref.name: policy_plugin(r, n), ref.params)
    if config.engine.kind == "replay" and config.workload.kind != "recorded":
        issues.append(ConfigIssue("engine.kind", "the replay engine needs workload kind 'recorded'"))
    return issues


def validate_config(data: Mapping[str, Any] | BatchConfig, source: str = "config") -> BatchConfig:
    """The one validation pass: schema, then plugins and their params. Raises ConfigError naming
    `source` (a file name) and every field at fault."""
    if isinstance(data, BatchConfig):
        data = data.model_dump(mode="json")
    try:
        config = BatchConfig.model_validate(dict(data), context={SKIP_PLUGINS: True})
    except ValidationError as exc:
        issues = _pydantic_issues("", exc)
    else:
        issues = check_plugins(config)
    if issues:
        lines = [f"{source}: invalid batch config ({len(issues)} problem(s))", *(f"  {i.line()}" for i in issues)]
        raise ConfigError("\n".join(lines), issues)
    return config


def read_config_data(path: Path) -> dict[str, Any]:
    """The mapping in a config file; ConfigError for a missing, binary, empty or unparsable file."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file", [ConfigIssue("", "no such file")])
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unknown config format {path.suffix!r}; expected .yaml, .yml, .json or .toml")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {len(raw)} bytes; a config is at most {MAX_CONFIG_BYTES} bytes")
    try:
        if b"\x00" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\x00"), raw.index(b"\x00") + 1, "NUL byte")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}); expected YAML or TOML") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else strict_yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot parse: {exc}") from None
    if data is None or data == {}:
        raise ConfigError(f"{path}: the config is empty; give at least a name and a workload (see docs/config.md)",
                          [ConfigIssue("", "empty config")])
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of settings, got {type(data).__name__}")
    return data


def load_config(path: str | Path) -> BatchConfig:
    """Read and validate a batch config file (see `validate_config`)."""
    path = Path(path)
    return validate_config(read_config_data(path), source=str(path))


def check_task_names(tasks: list[Any]) -> None:
    """Task ids and groups fit the store's columns (VARCHAR(200) on PostgreSQL; SQLite would accept
    longer ones and the same batch would fail on PostgreSQL mid-run): ValueError otherwise."""
    for t in tasks:
        for what, value in (("task id", t.task_id), ("group", t.group)):
            if not isinstance(value, str):
                raise ValueError(f"{what} {value!r} of a task is not a string")
            if len(value) > MAX_NAME_LENGTH:
                raise ValueError(f"{what} {value[:40]!r}... is {len(value)} characters long; at most {MAX_NAME_LENGTH}")
