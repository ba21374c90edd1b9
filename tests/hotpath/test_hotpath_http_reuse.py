"""The OpenAI-compatible client keeps one connection per worker across steps: a sample's steps do not
pay a TCP connect each, and the worker sees one keep-alive connection per concurrent request."""

from __future__ import annotations

import asyncio
import json

from agentbatch.engines.openai_http import OpenAIEngine
from agentbatch.protocols.engine import ChatRequest


async def _server(connections: list[int], bodies: list[dict]) -> asyncio.Server:
    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok", "tool_calls": None},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": 2}}).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                bodies.append(json.loads(await reader.readexactly(length)))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % len(answer) + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_sequential_steps_share_one_connection() -> None:
    connections: list[int] = []
    bodies: list[dict] = []

    async def scenario() -> list:
        server = await _server(connections, bodies)
        port = server.sockets[0].getsockname()[1]
        engine = OpenAIEngine("w", f"http://127.0.0.1:{port}/v1", "m")
        messages = [{"role": "user", "content": "ünï " * 50}]
        results = []
        for i in range(5):
            results.append(await engine.complete(ChatRequest(messages, [], sample_id=3, max_tokens=2)))
            messages = [*messages, results[-1].message, {"role": "user", "content": f"next {i}"}]
        await engine.aclose()
        server.close()
        return results

    results = asyncio.run(scenario())
    assert len(connections) == 1 and len(bodies) == 5
    assert [len(b["messages"]) for b in bodies] == [1, 3, 5, 7, 9]
    assert bodies[0]["messages"][0]["content"].startswith("ünï") and bodies[0]["user"] == "sample-3"
    assert all(r.prompt_tokens == 7 and r.output_tokens == 2 for r in results)
    assert results[0].message == {"role": "assistant", "content": "ok"}  # nulls dropped
