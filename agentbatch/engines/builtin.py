"""Parameter models of the built-in engines, and the `openai` engine's checked factory.

Shared by the scripted, replay and openai engines: `TimingParams` (a timing model's config, checked by
building it) and `EndpointParams` (one OpenAI-compatible server).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator

from agentbatch.engines.timing import make_timing
from agentbatch.protocols import strict_yaml
from agentbatch.protocols.plugins import PluginParams

MAX_WORKERS = 4096


class TimingParams(PluginParams):
    """{"kind": "token" | "simulated", ...that model's fields}, e.g. {"kind": "simulated",
    "profile": "llama3-8b-h100", "time_scale": 1.0}. Checked by building the model once."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    kind: str = "token"

    @model_validator(mode="after")
    def _buildable(self) -> TimingParams:
        values = self.model_dump()
        for key, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key}: expected a finite number, got {value}")
        try:
            make_timing(values)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        return self


class EndpointParams(PluginParams):
    name: str | None = Field(None, min_length=1, max_length=200, description="worker name in the store")
    base_url: str = Field(min_length=1, description="e.g. http://gpu0:8000/v1")
    model: str = Field(min_length=1, description="the served model's name")
    api_key: str | None = None

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value


def _endpoints_file(value: Any) -> Any:
    """A YAML/JSON file of endpoints (as `agentbatch workers up` writes) is read into its list."""
    if isinstance(value, str):
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"endpoints file {value!r} does not exist")
        try:
            data = strict_yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"endpoints file {value!r} cannot be read: {exc}") from None
        return data.get("endpoints", data) if isinstance(data, dict) else data
    return value


Endpoints = Annotated[list[EndpointParams], BeforeValidator(_endpoints_file), Field(min_length=1)]


class OpenAIParams(PluginParams):
    endpoints: Endpoints = Field(
        description="the servers: a list of {name, base_url, model, api_key} or a YAML/JSON file of that list"
    )
    timeout_s: float = Field(600.0, gt=0, le=86400, description="per request")
    timing: TimingParams | None = Field(
        None, description='the workers\' speed as a simulated timing model, read only by predictions (policy auto, '
        'whatif): {"kind": "simulated", "profile": a profile name or the JSON `agentbatch calibrate` writes, '
        '"time_scale": the speed serve-sim runs at}; requests still go to the endpoints')


def build_openai(params: dict[str, Any], workload: Any) -> list[Any]:
    """The `openai` engine: one worker per endpoint of an OpenAI-compatible server (vLLM, serve-sim)."""
    from agentbatch.engines.openai_http import build_openai_workers

    return build_openai_workers(params, workload)


build_openai.Params = OpenAIParams  # type: ignore[attr-defined]  # a plugin's Params (protocols/plugins.py)
