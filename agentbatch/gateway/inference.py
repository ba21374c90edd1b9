"""The OpenAI-compatible inference gateway: `/v1/chat/completions` (also streamed), `/v1/models`,
`/health`, `/metrics`, and the sample and batch endpoints.

A request is identified with its sample (`identity.py`), the sample is admitted, the router picks
the worker (back to the one that holds the sample's prefix unless it is overloaded), the request
waits for a slot of that worker (per-worker in-flight limit), goes out with the sample's
chain-progress priority, and comes back to the harness as the worker sent it (SSE chunks passed
through as they arrive). Each attempt is an inference step row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentbatch.db.step_records import inference_request
from agentbatch.gateway import jsonio
from agentbatch.gateway.forward import (
    TRANSPORT_ERRORS,
    StreamAccumulator,
    WorkerAnswer,
    is_answer,
    outcome_of,
)
from agentbatch.gateway.guard import request_body
from agentbatch.gateway.identity import SampleIdError, check_sample_id, explicit_inference_id
from agentbatch.gateway.routing import PARSED_BODY
from agentbatch.gateway.samples import GatewaySample, SampleEnd
from agentbatch.gateway.state import GatewayState, HeldSlot, abandon_step, acquire_step, release_step
from agentbatch.protocols.engine import EngineFailure
from agentbatch.protocols.retry import Call, StepFailed
from agentbatch.scheduling.types import StepKind

log = logging.getLogger("agentbatch.gateway")
class Answer:
    """A worker's answer read whole: status and bytes."""

    def __init__(self, status: int, content: bytes) -> None:
        self.status_code = status
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def error_response(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def request_record(sample: GatewaySample, body: dict[str, Any], priority: int | None) -> dict[str, Any]:
    """What is stored of a request (`db/step_records.py`): the messages new since the sample's previous
    request (all of them when the history was rewritten), and the tools when they changed."""
    messages = body["messages"]
    start = sample.seen_messages if sample.seen_messages <= len(messages) else 0
    tools = body.get("tools")
    # Compared as values (no serialising of the schemas per request); harnesses resend equal lists.
    changed = bool(tools) and (start == 0 or tools != sample.last_tools)
    sample.seen_messages, sample.last_tools = len(messages), tools or None
    return inference_request(messages, tools, priority, messages_from=start, with_tools=changed)


async def _send(state: GatewayState, held: HeldSlot, body: bytes,
                record: dict[str, Any]) -> tuple[WorkerAnswer | None, Answer | None, str | None]:
    """POST to the chosen worker (the response left open, to be read or streamed); connection errors
    and HTTP 5xx are engine failures, retried by the one retry rule (`protocols/retry.py`); every
    attempt is a step row. When the retries run out: the error (with the worker's last 5xx answer)."""
    worker = held.ticket.worker
    assert worker is not None
    last: list[Answer] = []  # the last 5xx answer, read whole

    async def attempt(n: int) -> WorkerAnswer:
        held.begin(state, record)
        try:
            resp = await state.pool.post(worker, body)
        except TRANSPORT_ERRORS as exc:
            error = f"{worker}: {exc.__class__.__name__}: {exc}"
            held.fail(state, error)
            raise EngineFailure(error) from exc
        if resp.status < 500:
            return resp
        try:
            answer = Answer(resp.status, await resp.read())
        except TRANSPORT_ERRORS:
            answer = Answer(resp.status, b"")
        finally:
            resp.release()
        error = f"{worker}: HTTP {resp.status}: {answer.text[:300]}"
        held.fail(state, error)
        last[:] = [answer]
        raise EngineFailure(error)

    try:
        resp = await state.settings.retry.run(Call(StepKind.INFERENCE, f"inference step {held.ticket.step_index}"),
                                              attempt)
        return resp, None, None
    except StepFailed as exc:
        return None, (last[0] if last else None), str(exc.__cause__ or exc)


def _done(state: GatewayState, held: HeldSlot, *, completed: bool, answered: bool = False) -> None:
    """The request ended: its worker slot and its hold on the sample go back (once)."""
    if not release_step(state, held, completed=completed):
        return
    state.registry.leave_request(held.sample, completed=completed, answered=answered)
    state.counters.requests += 1
    state.counters.failed += not completed


async def _answer(state: GatewayState, held: HeldSlot, response: WorkerAnswer) -> Response:
    """A whole (non-streamed) answer: record it and hand it back unchanged."""
    try:
        resp = Answer(response.status, await response.read())
    except TRANSPORT_ERRORS as exc:  # the worker went away in the middle of its answer
        error = f"{held.ticket.worker}: {exc.__class__.__name__}: {exc}"
        held.fail(state, error)
        _done(state, held, completed=False)
        return error_response(502, f"worker {held.ticket.worker} broke off its answer: {error}", "BadGatewayError")
    finally:
        response.release()
    if resp.status_code >= 400:
        held.fail(state, f"{held.ticket.worker}: HTTP {resp.status_code}: {resp.text[:300]}")
        _done(state, held, completed=False)
        return Response(resp.content, status_code=resp.status_code, media_type="application/json")
    try:
        data = jsonio.loads(resp.content)
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        held.fail(state, f"{held.ticket.worker}: malformed answer: {resp.text[:300]}")
        _done(state, held, completed=False)
        return error_response(502, f"worker {held.ticket.worker} sent a malformed answer", "BadGatewayError")
    held.complete(state, outcome_of(data, None, held.ticket.worker or ""))
    _done(state, held, completed=True, answered=is_answer(message))
    return Response(resp.content, status_code=resp.status_code, media_type="application/json")


class _GuardedStream(StreamingResponse):
    """A streaming response whose clean-up runs even when the body was never iterated (the client
    went away before the first byte): the slot must be given back either way."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[bool], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.cleanup = cleanup

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cleanup(False)


def _stream(state: GatewayState, held: HeldSlot, resp: WorkerAnswer, keep_usage: bool) -> Response:
    """Pass the worker's SSE events through as they come; record the rebuilt answer at the end."""
    acc = StreamAccumulator()
    state.counters.streamed += 1
    closed = False

    def cleanup(completed: bool) -> None:
        nonlocal closed
        resp.release()  # done already after the events; not for a stream cut off before its first byte
        if closed or held.released:  # ended already (the shutdown cancelled it)
            return
        closed = True
        if completed:
            outcome = outcome_of(acc.data(), acc.message(), held.ticket.worker or "")
            held.complete(state, outcome)
        else:
            held.fail(state, "stream interrupted")
        _done(state, held, completed=completed, answered=completed and is_answer(acc.message()))

    async def events() -> AsyncIterator[bytes]:
        completed = False
        try:
            async for raw in resp.pieces():
                if out := acc.feed(raw, keep_usage_chunk=keep_usage):
                    yield out
            if rest := acc.flush():
                yield rest
            completed = True
        finally:
            resp.release()
            cleanup(completed)

    return _GuardedStream(events(), cleanup, status_code=resp.status, media_type="text/event-stream")


def body_error(body: Any) -> str | None:
    """What is wrong with a chat-completions body in the fields the gateway reads, if anything."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return "`messages` must be a non-empty list of message objects"
    if not isinstance(body.get("stream", False), bool | None):
        return "`stream` must be true or false"
    if not isinstance(body.get("stream_options"), dict | None):
        return "`stream_options` must be an object"
    if not isinstance(body.get("tools"), list | None):
        return "`tools` must be a list"
    return None


def _read_body(raw: bytes, parsed: tuple[Any, bool] | None) -> tuple[dict[str, Any], bytes | None] | Response:
    """The request's JSON object, and its bytes when they can be passed on as they are
    (`jsonio.loads_passable`; `parsed`: its result, when the body was parsed already)."""
    try:
        body, passable = jsonio.loads_passable(raw) if parsed is None else parsed
    except (ValueError, UnicodeDecodeError):
        return error_response(400, "request body is not JSON")
    if error := body_error(body):
        return error_response(400, error)
    return body, raw if passable else None


async def _forward(state: GatewayState, held: HeldSlot, body: dict[str, Any], raw: bytes | None) -> Response:
    sample, worker = held.sample, held.ticket.worker or ""
    priority = state.coordinator.request_priority(sample.progress)
    forward = state.pool.body_for(worker, body, priority=priority, user=sample.key, raw=raw)
    resp, last, error = await _send(state, held, forward, request_record(sample, body, priority))
    if error is not None:  # retries ran out: the attempts are recorded as failed
        _done(state, held, completed=False)
        if last is not None:  # the worker's own 5xx answer
            return Response(last.content, status_code=last.status_code, media_type="application/json")
        return error_response(502, f"worker {worker} unreachable: {error}", "BadGatewayError")
    assert resp is not None
    if body.get("stream") and resp.status < 400:
        return _stream(state, held, resp, bool((body.get("stream_options") or {}).get("include_usage")))
    return await _answer(state, held, resp)


class ChatCompletions:
    """POST /v1/chat/completions as a plain ASGI app: no Request object or endpoint wrapper per request
    on the gateway's hottest path."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await request_body(receive)
        if raw is None:  # the client went away before its body was in
            return
        kept = scope.get(PARSED_BODY)  # parsed already by the router of several processes
        response = await chat_completion(self.state, Headers(scope=scope), raw,
                                         kept[1] if kept is not None and kept[0] is raw else None)
        await response(scope, receive, send)


async def chat_completion(state: GatewayState, headers: Headers, raw: bytes,
                          parsed: tuple[Any, bool] | None = None) -> Response:
    """One chat request: identified, admitted, given a worker slot, forwarded, answered."""
    read = _read_body(raw, parsed)
    if isinstance(read, Response):
        return read
    body, raw_out = read
    try:
        explicit = explicit_inference_id(headers, body)
    except SampleIdError as exc:
        return error_response(400, str(exc))
    sample = await state.registry.enter(explicit, body["messages"])
    try:
        held = await acquire_step(state, sample, StepKind.INFERENCE)
    except BaseException:
        state.registry.leave_request(sample, completed=False)
        raise
    try:
        return await _forward(state, held, body, raw_out)
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen input: the slots go back, a 500
        log.exception("gateway request of sample %r failed", sample.key)
        abandon_step(state, held, f"gateway error: {exc.__class__.__name__}: {exc}")
        return error_response(500, f"the gateway failed on this request: {exc.__class__.__name__}",
                              "InternalServerError")
    except BaseException:
        abandon_step(state, held, "cancelled: the request was cut off", cancelled=True)
        raise


def finish_sample(state: GatewayState) -> Callable[[Request], Any]:
    async def handle(request: Request) -> Response:
        key = request.path_params["sample"]
        try:
            check_sample_id(key, "the path's sample id")
        except SampleIdError as exc:
            return error_response(400, str(exc))
        raw = await request.body()
        try:
            data = json.loads(raw) if raw.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "body must be JSON: {score?, result?, error?}")
        score = data.get("score") if isinstance(data, dict) else None
        if not isinstance(data, dict) or (score is not None and not isinstance(score, int | float)):
            return error_response(400, "body must be a JSON object; `score` a number")
        result = data.get("result")
        end = SampleEnd("finish", score=None if score is None else float(score),
                        result=result if isinstance(result, dict) else None, error=data.get("error"))
        if not state.registry.finish(key, end):
            return error_response(404, f"no sample {key!r} in this batch", "NotFoundError")
        return JSONResponse({"sample": key, "ended": True})

    return handle


def batch_status(state: GatewayState) -> dict[str, Any]:
    c = state.coordinator
    return {
        "batch_id": state.batch_id, "samples": len(state.registry.samples), "active": state.registry.active,
        "ended": state.registry.ended, "yielded": state.registry.yields, "requests": state.counters.requests, "streamed": state.counters.streamed,
        "failed": state.counters.failed, "tool_calls": state.counters.tool_calls,
        "tool_failures": state.counters.tool_failures, "waiting": dict(state.counters.waiting),
        "in_use": c.in_use(), "peaks": c.peaks(), "sticky": c.sticky, "moves": c.moves, "policy": state.policy,
    }


def metrics_text(state: GatewayState) -> str:
    """Prometheus text: the gateway's counters and the coordinator's gates."""
    s = batch_status(state)
    lines = []
    for name in ("samples", "active", "ended", "yielded", "requests", "streamed", "failed", "tool_calls", "tool_failures",
                 "sticky", "moves"):
        lines.append(f"agentbatch_gateway_{name} {s[name]}")
    lines += [f'agentbatch_gateway_waiting{{kind="{k}"}} {v}' for k, v in s["waiting"].items()]
    lines += [f'agentbatch_gateway_in_use{{gate="{k}"}} {v}' for k, v in s["in_use"].items()]
    lines += [f'agentbatch_gateway_peak{{gate="{k}"}} {v}' for k, v in s["peaks"].items()]
    return "\n".join(lines) + "\n"


def routes(state: GatewayState, on_finish_batch: Callable[[], None]) -> list[Route]:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "agentbatch-gateway"} for m in state.pool.models]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "batch_id": state.batch_id})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(metrics_text(state))

    async def batch(request: Request) -> Response:
        return JSONResponse(batch_status(state))

    async def finish_batch(request: Request) -> Response:
        on_finish_batch()
        return JSONResponse({"batch_id": state.batch_id, "finishing": True})

    return [
        Route("/v1/chat/completions", ChatCompletions(state), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/batch", batch, methods=["GET"]),
        Route("/v1/batch/finish", finish_batch, methods=["POST"]),
        Route("/v1/samples/{sample:path}/finish", finish_sample(state), methods=["POST"]),
    ]
