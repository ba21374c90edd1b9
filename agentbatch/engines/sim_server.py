"""An OpenAI-compatible HTTP server in front of the simulated engine, in real time.

Endpoints: POST /v1/chat/completions (non-streaming, or `stream: true` as one SSE chunk at the end),
GET /v1/models, GET /health, GET /metrics (Prometheus text with vLLM's metric names). Requests are
tokenized with agentbatch's own tokenizer (`tokens.chat_tokens(messages, tools)`), so prefix-cache
hits follow the chat history exactly as a real engine's would.

Request fields: messages, tools, max_tokens / max_completion_tokens (with them the answer has exactly
that many tokens of filler text), ignore_eos and priority (vLLM extensions; priority is honoured,
lower first). agentbatch extensions: `sample_id` (or the OpenAI `user` field) names the agent sample,
which lets the engine reuse the previous turn's block hashes and count recomputed tokens;
`agentbatch_response` (an assistant message) is returned verbatim instead of filler text (replay).
The response carries usage with prompt_tokens_details.cached_tokens, and an `agentbatch` object with
the engine-side split: queue_s, prefill_s, decode_s, recomputed_tokens, worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agentbatch.engines.sim_timing import SimulatedTiming
from agentbatch.protocols.tokens import chat_tokens, count_tokens, render_message
from agentbatch.sim.model import RequestStats, SimRequest
from agentbatch.sim.profiles import EngineProfile

_FILLER = (" sim", " tok", " text", " of", " the", " agent", " batch", " run")


def filler_text(n: int) -> str:
    """Text of exactly n tokens for agentbatch's tokenizer (words of at most 4 characters)."""
    words = [w if len(w) <= 5 else w[:5] for w in _FILLER]
    return "".join(words[i % len(words)] for i in range(max(0, n)))


class SimServer:
    """The app and its engine; `app` is a Starlette ASGI application."""

    def __init__(
        self,
        profile: str | EngineProfile = "llama3-8b-h100",
        *,
        time_scale: float = 1.0,
        worker_name: str = "sim-0",
        served_model_name: str | None = None,
        policy: str = "priority",
        default_max_tokens: int = 64,
        **overrides: Any,
    ) -> None:
        self.engine = SimulatedTiming(
            profile, time_scale=time_scale, policy=policy, name=worker_name, **overrides
        )
        self.profile = self.engine.profile
        self.model_name = served_model_name or self.profile.name
        self.worker_name = worker_name
        self.default_max_tokens = default_max_tokens
        self._ids = itertools.count(1)
        self._anon = itertools.count(1)
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        yield
        await self.engine.aclose()

    # --- endpoints -------------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        try:
            call = self._parse_chat(await _json_body(request))
        except _BadRequest as exc:
            return _error(exc.status, exc.message, exc.kind)
        sample_id = self._sample_key(call.body)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        stats = await self.engine.submit(SimRequest(rid, sample_id, call.prompt, call.output_tokens,
                                                    priority=call.priority))  # fmt: skip
        if sample_id < 0:
            self.engine.model.forget_sample(sample_id)
        payload = self._payload(rid, call, stats)
        if call.body.get("stream"):
            return StreamingResponse(_sse(payload), media_type="text/event-stream")
        return JSONResponse(payload)

    def _parse_chat(self, body: Any) -> _ChatCall:
        """Validate a chat-completions body (raises _BadRequest, as an OpenAI server answers)."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise _BadRequest(400, "`messages` must be a non-empty list")
        model = body.get("model") or self.model_name
        if model != self.model_name:
            raise _BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            prompt = chat_tokens(body["messages"], body.get("tools") or None)
        except (TypeError, AttributeError) as exc:
            raise _BadRequest(400, f"cannot render messages: {exc}") from None
        scripted = body.get("agentbatch_response")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise _BadRequest(400, "max_tokens must be a positive integer")
        priority = body.get("priority", 0)
        if not isinstance(priority, int):
            raise _BadRequest(400, "priority must be an integer")
        scripted = scripted if isinstance(scripted, dict) else None
        if max_tokens is not None:
            n_out = max_tokens
        elif scripted is not None:
            n_out = max(1, count_tokens(render_message(scripted)))
        else:
            n_out = self.default_max_tokens
        return _ChatCall(body, prompt, n_out, max_tokens, priority, scripted)

    def _payload(self, rid: str, call: _ChatCall, stats: RequestStats) -> dict[str, Any]:
        message, finish = _answer(call, stats)
        s = self.engine.time_scale
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": stats.prompt_tokens,
                "completion_tokens": stats.output_tokens,
                "total_tokens": stats.prompt_tokens + stats.output_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
            },
            "agentbatch": {
                "queue_s": stats.queue_s * s,
                "prefill_s": stats.prefill_s * s,
                "decode_s": stats.decode_s * s,
                "recomputed_tokens": stats.recomputed_tokens,
                "preemptions": stats.preemptions,
                "worker": self.worker_name,
            },
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "agentbatch-sim",
                        "root": self.profile.name,
                        "max_model_len": self.profile.kv_capacity_tokens,
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(prometheus_text(self.engine.metrics(), self.profile, self.model_name))

    def _sample_key(self, body: dict[str, Any]) -> int:
        sample = body.get("sample_id", body.get("user"))
        if isinstance(sample, int):
            return sample
        if isinstance(sample, str) and sample:
            return zlib.crc32(sample.encode())
        return -next(self._anon)  # unknown sample: no per-sample memo


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass(frozen=True)
class _ChatCall:
    """A validated chat-completions request."""

    body: dict[str, Any]
    prompt: list[int]
    output_tokens: int
    max_tokens: int | None  # as the client asked (then the answer stops for "length")
    priority: int
    scripted: dict[str, Any] | None  # agentbatch_response: the assistant message to return


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _BadRequest(400, "request body is not JSON") from None


def _answer(call: _ChatCall, stats: RequestStats) -> tuple[dict[str, Any], str]:
    """The assistant message and its finish reason: the scripted one, or filler of the sampled length."""
    scripted = call.scripted
    if scripted is not None:
        message = {"role": "assistant", "content": scripted.get("content")}
        if scripted.get("tool_calls"):
            message["tool_calls"] = scripted["tool_calls"]
        return message, "tool_calls" if scripted.get("tool_calls") else "stop"
    message = {"role": "assistant", "content": filler_text(stats.output_tokens)}
    return message, "length" if call.max_tokens is not None else "stop"


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def _sse(payload: dict[str, Any]):  # one chunk with the whole answer, then the usage
    choice = payload["choices"][0]
    chunk = {
        "id": payload["id"],
        "object": "chat.completion.chunk",
        "created": payload["created"],
        "model": payload["model"],
        "choices": [{"index": 0, "delta": choice["message"], "finish_reason": choice["finish_reason"]}],
        "usage": payload["usage"],
    }
    yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


# --- /metrics ------------------------------------------------------------------------------------
_METRICS = [
    # (vLLM name, our key, type, help)
    (
        "vllm:num_requests_running",
        "num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
    ),
    (
        "vllm:num_requests_waiting",
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
    ),
    (
        "vllm:kv_cache_usage_perc",
        "kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
    ),
    (
        "vllm:prefix_cache_queries",
        "prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in tokens.",
    ),
    ("vllm:prefix_cache_hits", "prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens."),
    ("vllm:num_preemptions", "num_preemptions_total", "counter", "Cumulative number of preemptions."),
    ("vllm:prompt_tokens", "prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    (
        "vllm:generation_tokens",
        "generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
    ),
    (
        "vllm:request_success",
        "requests_finished_total",
        "counter",
        "Count of successfully processed requests.",
    ),
    (
        "agentbatch:recomputed_tokens",
        "recomputed_tokens_total",
        "counter",
        "Tokens computed again (simulated).",
    ),
    (
        "agentbatch:evicted_blocks",
        "evicted_blocks_total",
        "counter",
        "KV blocks evicted from the prefix cache.",
    ),
    ("agentbatch:busy_seconds", "busy_s_total", "counter", "Model seconds spent in engine steps."),
]


def prometheus_text(metrics: dict[str, float], profile: EngineProfile, model_name: str) -> str:
    """Prometheus exposition text as vLLM writes it (counters carry a `_total` sample name)."""
    labels = f'engine="0",model_name="{model_name}"'
    lines: list[str] = []
    for name, key, kind, help_text in _METRICS:
        sample = f"{name}_total" if kind == "counter" else name
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f"{sample}{{{labels}}} {float(metrics.get(key, 0.0))}",
        ]
    info = {
        "engine": "0",
        "model_name": model_name,
        "block_size": profile.block_size,
        "num_gpu_blocks": profile.num_kv_blocks,
        "enable_prefix_caching": profile.enable_prefix_caching,
        "max_num_seqs": profile.max_num_seqs,
        "max_num_batched_tokens": profile.max_num_batched_tokens,
        "mamba_num_slots": profile.state_slots if profile.state_slots is not None else "None",
        "backend": "agentbatch-sim",
        "profile": profile.name,
    }
    info_labels = ",".join(f'{k}="{v}"' for k, v in info.items())
    lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f"vllm:cache_config_info{{{info_labels}}} 1.0",
    ]
    return "\n".join(lines) + "\n"


# --- running it ----------------------------------------------------------------------------------
def serve(server: SimServer, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve until interrupted (the `agentbatch serve-sim` command)."""
    import uvicorn

    uvicorn.run(server.app, host=host, port=port, log_level=log_level, access_log=False)


@contextlib.contextmanager
def running_sim_server(
    profile: str | EngineProfile = "tiny-cpu", *, host: str = "127.0.0.1", port: int = 0, **kwargs: Any
) -> Iterator[str]:
    """Run a SimServer in a background thread on a free port (or `port`); yields its base URL
    (`http://127.0.0.1:PORT/v1`). For tests and notebooks."""
    import uvicorn

    server = SimServer(profile, **kwargs)
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only then (no 40 ms
    # delayed-ACK stall per request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(server.app, log_level="warning", access_log=False, lifespan="on")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the simulated engine server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound_port}/v1"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()
