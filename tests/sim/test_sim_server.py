"""The simulated engine in real time: the TimingModel and the OpenAI-compatible HTTP server, over real
HTTP on 127.0.0.1 (httpx)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentbatch.engines.sim_server import filler_text, running_sim_server
from agentbatch.engines.timing import make_timing
from agentbatch.protocols.tokens import chat_tokens, count_tokens
from agentbatch.sim import get_profile

SYSTEM = {"role": "system", "content": "You are a careful agent. Use the tools. " * 40}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "list files",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def _metrics(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        out[name_labels.split("{")[0]] = float(value)
        if name_labels.startswith("vllm:cache_config_info"):
            out["_cache_config"] = name_labels  # type: ignore[assignment]
    return out


def _shared_full_blocks(a: list[int], b: list[int], block: int) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return min(n // block, (len(b) - 1) // block) * block


@pytest.fixture(scope="module")
def server():
    with running_sim_server("tiny-cpu", time_scale=0.001, default_max_tokens=8) as url:
        yield url


def test_filler_text_has_exactly_the_requested_tokens():
    for n in (0, 1, 5, 64, 333):
        assert count_tokens(filler_text(n)) == n


def test_models_and_health(server):
    models = httpx.get(f"{server}/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "tiny-cpu"
    assert httpx.get(server.removesuffix("/v1") + "/health").status_code == 200


def test_chat_completion_usage_cache_hits_and_metrics(server):
    before = _metrics(server)
    turn1 = [SYSTEM, {"role": "user", "content": "list the files in the working directory"}]
    r1 = httpx.post(
        f"{server}/chat/completions",
        json={
            "model": "tiny-cpu",
            "messages": turn1,
            "tools": TOOLS,
            "max_tokens": 17,
            "ignore_eos": True,
            "user": "s1",
        },
    ).json()
    p1 = chat_tokens(turn1, TOOLS)
    assert r1["object"] == "chat.completion"
    assert r1["usage"]["prompt_tokens"] == len(p1)
    assert r1["usage"]["completion_tokens"] == 17
    assert r1["usage"]["total_tokens"] == len(p1) + 17
    assert count_tokens(r1["choices"][0]["message"]["content"]) == 17
    assert r1["choices"][0]["finish_reason"] == "length"

    turn2 = turn1 + [r1["choices"][0]["message"], {"role": "user", "content": "now count them"}]
    r2 = httpx.post(
        f"{server}/chat/completions",
        json={"model": "tiny-cpu", "messages": turn2, "tools": TOOLS, "max_tokens": 3, "user": "s1"},
    ).json()
    p2 = chat_tokens(turn2, TOOLS)
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    # vLLM semantics: whole blocks (128 on a CPU worker) of the shared prefix, never the last token
    assert cached == _shared_full_blocks(p1, p2, 128)
    assert cached > 0 and cached % 128 == 0
    assert r2["agentbatch"]["recomputed_tokens"] == 0

    after = _metrics(server)
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == len(
        p1
    ) + len(p2)
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == cached
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 20
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert 0.0 <= after["vllm:kv_cache_usage_perc"] <= 1.0
    assert 'block_size="128"' in after["_cache_config"]  # type: ignore[operator]


def test_default_length_and_scripted_answer(server):
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{server}/chat/completions", json={"messages": msgs}).json()
    assert r["usage"]["completion_tokens"] == 8  # the server's default_max_tokens
    assert r["choices"][0]["finish_reason"] == "stop"
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    r = httpx.post(
        f"{server}/chat/completions",
        json={
            "messages": msgs,
            "agentbatch_response": {"role": "assistant", "content": None, "tool_calls": [call]},
        },
    ).json()
    assert r["choices"][0]["message"]["tool_calls"] == [call]
    assert r["choices"][0]["finish_reason"] == "tool_calls"


def test_bad_requests_are_openai_errors(server):
    assert httpx.post(f"{server}/chat/completions", json={"messages": []}).status_code == 400
    assert httpx.post(f"{server}/chat/completions", content=b"not json").status_code == 400
    r = httpx.post(
        f"{server}/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404 and "error" in r.json()
    bad = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
    assert httpx.post(f"{server}/chat/completions", json=bad).status_code == 400


def test_streaming_returns_one_chunk_and_done(server):
    body = {"messages": [{"role": "user", "content": "stream"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server}/chat/completions", json=body) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunk = json.loads(events[0].removeprefix("data: "))
    assert chunk["object"] == "chat.completion.chunk"
    assert count_tokens(chunk["choices"][0]["delta"]["content"]) == 4


def test_priority_is_honoured_over_http():
    """One sequence at a time: while a long request runs (~1.2 s in real time), a priority-5 request
    arrives before a priority-1 one; the priority-1 request runs first."""

    async def until(url: str, metric: str, blocker: asyncio.Task) -> None:
        while _metrics(url).get(metric, 0) < 1:
            assert not blocker.done(), "the long request ended before the others were queued"
            await asyncio.sleep(0.005)

    async def scenario(url: str) -> dict[str, float]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def ask(text: str, out: int, priority: int) -> dict:
                body = {
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": out,
                    "priority": priority,
                }
                return (await client.post("/chat/completions", json=body)).json()

            blocker = asyncio.create_task(ask("long", 300, 0))
            await asyncio.wait_for(until(url, "vllm:num_requests_running", blocker), 30)
            low = asyncio.create_task(ask("low", 5, 5))
            await asyncio.wait_for(until(url, "vllm:num_requests_waiting", blocker), 30)
            high = asyncio.create_task(ask("high", 5, 1))
            done = await asyncio.wait_for(asyncio.gather(blocker, low, high), 60)
            return {"low": done[1]["agentbatch"]["queue_s"], "high": done[2]["agentbatch"]["queue_s"]}

    with running_sim_server("tiny-cpu", time_scale=1.0, max_num_seqs=1, max_num_batched_tokens=2048) as url:
        q = asyncio.run(scenario(url))
    assert q["high"] < q["low"]


def test_simulated_timing_model_shares_one_engine_per_worker():
    async def scenario():
        timing = make_timing({"kind": "simulated", "profile": "llama3-8b-h100", "time_scale": 0.001})
        prompt = list(range(3000))
        first = await timing.run(request_id="a", sample_id=1, prompt=prompt, output_tokens=20, priority=None)
        second = await asyncio.gather(
            *[
                timing.run(
                    request_id=f"b{i}", sample_id=10 + i, prompt=prompt + [i], output_tokens=20, priority=0
                )
                for i in range(4)
            ]
        )
        # a request that is cancelled is taken out of the engine
        task = asyncio.create_task(
            timing.run(
                request_id="gone",
                sample_id=99,
                prompt=list(range(5000, 9000)),
                output_tokens=5000,
                priority=0,
            )
        )
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        metrics = timing.metrics()
        has_work = timing.model.has_work()
        await timing.aclose()
        return first, second, metrics, has_work

    first, second, metrics, has_work = asyncio.run(scenario())
    assert first.cached_prompt_tokens == 0
    assert all(t.cached_prompt_tokens == 2992 for t in second)  # 187 full blocks of 16
    assert first.prefill_s > 0 and first.decode_s > 0
    assert metrics["requests_finished_total"] == 5
    assert metrics["prefix_cache_hits_total"] == 4 * 2992
    assert not has_work


def test_unknown_timing_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown engine profile"):
        make_timing({"kind": "simulated", "profile": "gpt-9-on-a-toaster"})
    with pytest.raises(ValueError, match="unknown profile field"):
        make_timing({"kind": "simulated", "profile": "tiny-cpu", "num_gpus": 8})
    timing = make_timing(
        {"kind": "simulated", "profile": "tiny-cpu", "num_kv_blocks": 100, "cost": {"c0": 0.5}}
    )
    assert timing.profile.num_kv_blocks == 100 and timing.profile.cost.c0 == 0.5
    assert timing.profile.cost.c_decode == get_profile("tiny-cpu").cost.c_decode


def test_the_vllm_metrics_scraper_reads_the_simulated_server(server):
    """agentbatch's own /metrics scraper (written against real vLLM) understands the simulated one."""
    from agentbatch.engines.metrics import scrape

    async def go():
        async with httpx.AsyncClient() as client:
            return await scrape(client, "sim-0", server)

    m = asyncio.run(go())
    assert m.ok
    assert m.block_size == 128
    assert m.cache_config["enable_prefix_caching"] == "True"
    assert m.prefix_cache_queries >= m.prefix_cache_hits >= 0
    assert m.kv_cache_usage is not None
