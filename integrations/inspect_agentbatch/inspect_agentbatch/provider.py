"""The `agentbatch` model provider: inspect's OpenAI-compatible client pointed at the gateway."""

from __future__ import annotations

import os
from typing import Any

from inspect_ai.model import GenerateConfig, modelapi
from inspect_ai.model._providers.openai_compatible import OpenAICompatibleAPI

from inspect_agentbatch.identity import SAMPLE_HEADER, gateway_root, note_started


@modelapi(name="agentbatch")
class AgentbatchAPI(OpenAICompatibleAPI):
    """`--model agentbatch/<model>`: requests go to the gateway (`--model-base-url` or
    AGENTBATCH_BASE_URL, default http://127.0.0.1:8100), each naming its sample."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig | None = None, **model_args: Any) -> None:
        self.gateway = gateway_root(base_url)
        super().__init__(model_name, base_url=self.gateway + "/v1",
                         api_key=api_key or os.environ.get("AGENTBATCH_API_KEY") or "agentbatch",
                         config=config or GenerateConfig(), service="agentbatch", **model_args)

    def request_headers(self, config: GenerateConfig) -> dict[str, str]:
        key = note_started(self.gateway)
        return {SAMPLE_HEADER: key} if key else {}
