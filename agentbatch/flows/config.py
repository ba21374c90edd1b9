"""Batch configuration: a YAML or TOML file validated with pydantic.

A bad file is reported with the file name, the path of the offending field and what was expected,
before anything is written to the store.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentbatch.scheduling.defaults import DEFAULTS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadConfig(_Strict):
    kind: str = Field("bfcl", description="workload name (see agentbatch.environments.registry)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the workload")


class EngineConfig(_Strict):
    kind: str = Field("scripted", description="engine name (see agentbatch.engines.registry)")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the engine factory, e.g. workers, timing, endpoints",
    )


class PolicyRef(_Strict):
    name: str = "fifo"
    params: dict[str, Any] = Field(default_factory=dict)


class SchedulingConfig(_Strict):
    # Every default comes from agentbatch.scheduling.defaults (shared with `replay` and virtual time).
    max_active_samples: int = Field(DEFAULTS.max_active_samples, ge=1,
                                    description="samples admitted at once (reference concurrency)")
    env_slots: int = Field(DEFAULTS.env_slots, ge=1, description="environment actions running at once")
    per_worker_inflight: int = Field(DEFAULTS.per_worker_inflight, ge=1,
                                     description="inference requests in flight per engine worker")
    coupled: bool = Field(DEFAULTS.coupled, description="baseline: a sample holds an environment slot while admitted")
    admission_order: Literal["arrival", "longest_prior_first"] = Field(
        DEFAULTS.admission_order,  # type: ignore[arg-type]
        description="order samples are admitted in: as listed, or longest recorded chain (earlier batches "
        "of the same task ids) first, unknown ones after; the same as arrival when there is no history",
    )
    # Defaults are the coordination policies (the ablation in docs/ablation.md); the baseline is
    # coupled: true, env_queue fifo, router round_robin, priority fcfs.
    env_queue: PolicyRef = Field(default_factory=lambda: PolicyRef(name=DEFAULTS.env_queue),
                                 description="order of the environment-action queue")
    inference_queue: PolicyRef = Field(default_factory=lambda: PolicyRef(name=DEFAULTS.inference_queue),
                                       description="order of each worker's queue")
    router: PolicyRef = Field(default_factory=lambda: PolicyRef(name=DEFAULTS.router),
                              description="which engine worker serves a sample's next inference call")
    priority: PolicyRef = Field(
        default_factory=lambda: PolicyRef(name=DEFAULTS.priority), description="per-request engine priority"
    )
    priors: dict[str, float] | None = Field(
        None, description="task id -> expected chain steps for history-aware policies and admission order; "
        "unset: from earlier batches in the store. Controlled replay pins them (from --priors, else none)",
    )


class LimitsConfig(_Strict):
    max_steps: int = Field(80, ge=2, description="steps (inference + environment) per sample at most")
    step_timeout_s: float = Field(600.0, gt=0, description="an environment step taking longer fails")


class RetryConfig(_Strict):
    environment: int = Field(2, ge=0, description="retries of an environment step after an infrastructure error")
    inference: int = Field(2, ge=0, description="retries of an inference step after an engine error")
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")


class ExecutionConfig(_Strict):
    mode: Literal["steps", "lean"] = Field(
        "steps",
        description="steps: one Prefect task per step; lean: one Prefect task per sample chain "
        "(steps still recorded in the store), for huge batches",
    )


class BatchConfig(_Strict):
    name: str = "batch"
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)

    @model_validator(mode="after")
    def _check_policies(self) -> BatchConfig:
        # Fail at load time, not mid-batch, on unknown policy or component names.
        from agentbatch.engines.registry import ENGINES
        from agentbatch.environments.registry import WORKLOADS
        from agentbatch.scheduling import registry

        checks = [
            ("workload.kind", self.workload.kind, WORKLOADS),
            ("engine.kind", self.engine.kind, ENGINES),
            ("scheduling.env_queue.name", self.scheduling.env_queue.name, registry.QUEUE_POLICIES),
            ("scheduling.inference_queue.name", self.scheduling.inference_queue.name, registry.QUEUE_POLICIES),
            ("scheduling.router.name", self.scheduling.router.name, registry.ROUTERS),
            ("scheduling.priority.name", self.scheduling.priority.name, registry.PRIORITIES),
        ]
        for field, value, table in checks:
            if value not in table:
                raise ValueError(f"{field}: unknown name {value!r}; expected one of {sorted(table)}")
        return self


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the field."""


def _format_validation(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid batch config ({err.error_count()} problem(s))"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}" + (f" (got {e['input']!r})" if "input" in e and e["loc"] else ""))
    return "\n".join(lines)


def load_config(path: str | Path) -> BatchConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml", ".json"):
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"{path}: unknown config format {path.suffix!r}; expected .yaml, .yml, .json or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot parse: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of settings, got {type(data).__name__}")
    try:
        return BatchConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(path, exc)) from exc
