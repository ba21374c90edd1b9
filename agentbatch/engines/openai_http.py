"""An OpenAI-compatible chat-completions client (vLLM's server, the simulated server, others).

Passes the vLLM extensions through when set: `priority` (with `--scheduling-policy priority`) and
`ignore_eos` (forces the output length together with `max_tokens`, for controlled replay).

The transport is aiohttp, one session per worker with its connections kept alive across steps: this
is the runner's hot path (a request of a long conversation costs ~1 ms of CPU with it, ~2.5 ms with
httpx; bench/cluster_rate.py). The number of requests in flight is bounded by the coordinator's
per-worker slots, not by the connection pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
import yarl

from agentbatch.engines.chat_json import request_body
from agentbatch.protocols.engine import ChatRequest, ChatResult, EngineFailure


def endpoint_auth(base_url: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    """An OpenAI-compatible endpoint's URL without credentials, and the JSON request headers for it.

    aiohttp refuses an Authorization header beside credentials in the URL: the URL's user:password
    becomes Basic auth, and an api_key (Bearer) wins over it, as it did with the earlier client."""
    headers = {"Content-Type": "application/json"}
    url = yarl.URL(base_url.rstrip("/"))
    if url.user is not None:
        headers["Authorization"] = aiohttp.BasicAuth(url.user, url.password or "").encode()
        url = url.with_user(None)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return str(url), headers


class OpenAIEngine:
    def __init__(
        self, name: str, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 600.0
    ) -> None:
        self.name = name
        self.model = model
        self.base_url, self._headers = endpoint_auth(base_url, api_key)
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the session belongs to

    def _client(self) -> aiohttp.ClientSession:
        """The session, opened on first use in the running event loop (and again if that loop changed)."""
        session, loop = self._session, asyncio.get_running_loop()
        if session is None or session.closed or self._loop is not loop:
            session = self._session = aiohttp.ClientSession(
                timeout=self._timeout, headers=self._headers, connector=aiohttp.TCPConnector(limit=0))
            self._loop = loop
        return session

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "temperature": request.temperature,
        }
        if request.tools:
            body["tools"] = request.tools
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = request.max_tokens or 0
        if request.priority is not None:
            body["priority"] = request.priority
        # OpenAI's end-user id; vLLM ignores it, the simulated server keys its per-sample state on it.
        body.setdefault("user", f"sample-{request.sample_id}")
        body.update(request.extra)
        return body

    async def complete(self, request: ChatRequest) -> ChatResult:
        start = time.perf_counter()
        body = request_body(self.payload(request))  # the conversation's prefix encoded once (chat_json.py)
        try:
            async with self._client().post(self.base_url + "/chat/completions", data=body) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineFailure(f"{self.name}: {exc.__class__.__name__}: {exc}") from exc
        latency = time.perf_counter() - start
        if status >= 400:
            raise EngineFailure(f"{self.name}: HTTP {status}: {raw[:500].decode('utf-8', 'replace')}")
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineFailure(f"{self.name}: malformed response: {raw[:500].decode('utf-8', 'replace')}") from exc
        message = {k: v for k, v in choice["message"].items() if v is not None or k == "content"}
        message["role"] = "assistant"
        if not message.get("tool_calls"):
            message.pop("tool_calls", None)
        details = usage.get("prompt_tokens_details") or {}
        split = data.get("agentbatch") or {}  # the simulated server's engine-side timing split
        return ChatResult(
            message=message,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
            cached_prompt_tokens=None if details.get("cached_tokens") is None else int(details["cached_tokens"]),
            latency_s=latency,
            queue_s=float(split.get("queue_s", 0.0)),
            prefill_s=float(split.get("prefill_s", 0.0)),
            decode_s=float(split.get("decode_s", 0.0)),
            recomputed_tokens=int(split.get("recomputed_tokens", 0)),
            worker=self.name,
            finish_reason=choice.get("finish_reason") or "stop",
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def load_endpoints(spec: Any) -> list[dict[str, Any]]:
    """Endpoints from a list of {name?, base_url, model, api_key?} or a YAML/JSON file of that list
    (as `agentbatch workers up` writes)."""
    if isinstance(spec, str | Path):
        data = yaml.safe_load(Path(spec).read_text())
        spec = data.get("endpoints", data) if isinstance(data, dict) else data
    if not isinstance(spec, list) or not spec:
        raise ValueError("engine.params.endpoints: expected a non-empty list of {base_url, model} or a file")
    out = []
    for i, ep in enumerate(spec):
        if not isinstance(ep, dict) or "base_url" not in ep or "model" not in ep:
            raise ValueError(f"engine.params.endpoints[{i}]: expected a mapping with base_url and model")
        out.append({"name": ep.get("name") or f"worker-{i}", **ep})
    return out


def build_openai_workers(params: dict[str, Any], workload: Any) -> list[OpenAIEngine]:
    """params: endpoints (list or file), timeout_s."""
    endpoints = load_endpoints(params.get("endpoints"))
    timeout = float(params.get("timeout_s", 600.0))
    return [
        OpenAIEngine(ep["name"], ep["base_url"], ep["model"], ep.get("api_key"), timeout) for ep in endpoints
    ]
