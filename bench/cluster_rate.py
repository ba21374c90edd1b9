"""Orchestration cost at cluster rates: client CPU per step on the real HTTP path, in one run.

A fake OpenAI-compatible worker (`--serve-fake PORT`: this file run as its own process) answers every
chat request at once with a fixed assistant turn that calls a tool; it stands in for the *speed* of a
vLLM node (hundreds of answers a second), not its behaviour (no tokenizer, no batching, no cache).
What is measured is the CPU of the agentbatch process itself, in CPU seconds (resource.getrusage of
that process, or psutil for the gateway's), not wall time, so the figures hold on a loaded machine:

- `run` in each execution mode (chains = the visible default, steps, lean): a recorded `mcp_like`
  batch replayed live (`agentbatch replay --mode live`'s config: engine `replay` over `openai`, the
  recorded environment at time scale 0) against two fake workers; conversations of 8-20 k tokens
  (a 8 k-token system prompt, observations appended each step) and 16 tool schemas.
- `agentbatch gateway --processes N` (N = 1, 2, 4; several processes on PostgreSQL, `--db` or
  $AGENTBATCH_TEST_PG_URL) in front of the fake worker and the probe MCP server: concurrent clients
  send growing 8 k+ token conversations to /v1/chat/completions, the same streamed (`stream: true`: the
  fake worker sends a 64-token answer as 69 SSE events, each written by itself; 68 reach the client,
  which did not ask for usage), then `echo` tool
  calls through /mcp. The gateway's CPU (all its processes) per request, streamed request and tool call.

Last line: `runner ms/step A (visible) B (lean); gateway req/s/core C; tool calls/s/core D; ...;
streamed req/s/core E`.

    .venv/bin/python bench/cluster_rate.py [--samples 24] [--requests 400] [--streamed 400] [--tool-calls 400]
        [--processes 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quiet_prefect  # noqa: E402, F401 - Prefect settings before Prefect is imported

SYSTEM_TOKENS = 8000  # every conversation starts at 8 k tokens and grows with its observations
TOOLS = 16


def tool_schemas(n: int = TOOLS) -> list[dict[str, Any]]:
    """n realistic function schemas (a few typed parameters each, descriptions)."""
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool {i}: looks up records in service {i} and returns them as JSON.",
        "parameters": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "what to look up"},
            "limit": {"type": "integer", "description": "at most this many records", "default": 10},
            "fields": {"type": "array", "items": {"type": "string"}, "description": "fields to return"},
            "strict": {"type": "boolean", "description": "exact matches only"}}}}} for i in range(n)]


# --- the fake worker ------------------------------------------------------------------------------------

ANSWER = {"role": "assistant", "content": "Looking it up. " * 8, "tool_calls": [{
    "id": "call_0", "type": "function", "function": {"name": "tool_0", "arguments": '{"query": "x"}'}}]}
STREAMED_WORDS = ("Looking it up now. " * 16).split()  # a streamed answer: 64 tokens, one event each
STREAMED = {**ANSWER, "content": "".join(w + " " for w in STREAMED_WORDS)}


def sse_events(request: dict[str, Any]) -> list[bytes]:
    """A streamed answer as a vLLM server sends it: role, 64 content deltas, the tool call, the finish,
    the usage chunk when asked for, [DONE]."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": "fake", "object": "chat.completion.chunk", "model": "fake", "choices": choices, **extra}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": 0, "delta": d, "finish_reason": finish}])

    call = {**ANSWER["tool_calls"][0], "index": 0}
    events = [delta({"role": "assistant", "content": ""}), *(delta({"content": w + " "}) for w in STREAMED_WORDS),
              delta({"tool_calls": [call]}), delta({}, "tool_calls")]
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(event([], usage={"prompt_tokens": 1000, "completion_tokens": len(STREAMED_WORDS) + 4,
                                       "total_tokens": 1068}))
    return [*events, b"data: [DONE]\n\n"]


def serve_fake(port: int) -> None:
    """A raw-asyncio HTTP/1.1 server (keep-alive) answering POST /chat/completions at once (chunked SSE
    events, each written by itself, when the request streams)."""
    answer = ANSWER

    def reply(body: bytes) -> bytes | list[bytes]:
        try:
            request = json.loads(body)
            max_tokens = request.get("max_tokens") or 32
        except ValueError:
            return b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"
        if request.get("stream"):
            return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                    *(b"%x\r\n%s\r\n" % (len(e), e) for e in sse_events(request)), b"0\r\n\r\n"]
        data = json.dumps({"id": "fake", "object": "chat.completion", "model": "fake", "choices": [
            {"index": 0, "message": answer, "finish_reason": "tool_calls"}], "usage": {
            "prompt_tokens": len(body) // 5, "completion_tokens": max_tokens,
            "total_tokens": len(body) // 5 + max_tokens}}).encode()
        return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data)) + data

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                out = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" if head.startswith(b"GET") else reply(body)
                for piece in [out] if isinstance(out, bytes) else out:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)  # events leave one by one, as a server decoding token by token sends them
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def fake_worker(stack: ExitStack, tmp: Path, name: str) -> str:
    from gateway_overhead import free_port, process

    port = free_port()
    stack.enter_context(process([str(Path(__file__).resolve()), "--serve-fake", str(port)],
                                f"http://127.0.0.1:{port}/health", tmp / f"{name}.log"))
    return f"http://127.0.0.1:{port}/v1"


# --- run, in each execution mode ------------------------------------------------------------------------

def long_trace(samples: int, path: Path) -> Path:
    """The mcp_like family with an 8 k-token system prompt and 16 tool schemas on every sample."""
    from agentbatch.traces.conversation import filler, initial_messages
    from agentbatch.traces.generators import generate, get_family
    from agentbatch.traces.parquet import write_trace

    trace = generate(get_family("mcp_like"), samples, seed=3)
    system = filler(SYSTEM_TOKENS, "system/cluster-rate")
    for s in trace.samples:
        opening = initial_messages(s)
        s.messages = [{"role": "system", "content": system}, opening[-1]]
        s.tools = tool_schemas()
    return write_trace(trace, path)


def run_config(trace: Path, workers: list[str], mode: str) -> Any:
    from agentbatch.flows.config import BatchConfig

    return BatchConfig.model_validate({
        "name": f"cluster-rate-{mode}",
        "workload": {"kind": "recorded", "params": {"trace": str(trace), "time_scale": 0.0}},
        "engine": {"kind": "replay", "params": {"inner": "openai", "endpoints": [
            {"name": f"worker-{i}", "base_url": u, "model": "fake"} for i, u in enumerate(workers)]}},
        "scheduling": {"max_active_samples": 64, "env_slots": 16, "per_worker_inflight": 32},
        "execution": {"mode": mode},
        "limits": {"max_steps": 100_000},
    })


def cpu_s() -> float:
    """This process's CPU time, every thread (the group writer's included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_run(store: Any, trace: Path, workers: list[str], mode: str) -> tuple[float, float, int]:
    """(wall s, client CPU s, steps) of one batch run in `mode`."""
    from agentbatch.flows.batch import run_batch

    wall, cpu = time.perf_counter(), cpu_s()
    batch_id = run_batch(run_config(trace, workers, mode), store, show_progress=False)
    wall, cpu = time.perf_counter() - wall, cpu_s() - cpu
    steps = sum(1 for s in store.steps(batch_id) if s.status == "completed")
    failed = [s.index for s in store.samples(batch_id) if s.status != "completed"]
    assert not failed, f"{mode}: samples {failed} did not complete"
    return wall, cpu, steps


# --- the gateway ----------------------------------------------------------------------------------------

async def drive_inference(url: str, requests: int, clients: int, *, stream: bool = False) -> None:
    """`clients` conversations, each growing by one assistant turn and one observation per request;
    with `stream`, each answer read event by event to its [DONE]."""
    import httpx

    from agentbatch.traces.conversation import filler

    system = filler(SYSTEM_TOKENS, "system/cluster-rate")
    tools = tool_schemas()
    counter = iter(range(requests))
    kind = "streamed" if stream else "sample"

    async def answer(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        if not stream:
            r = await http.post(url + "/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]
        async with http.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200, await r.aread()
            events = [line async for line in r.aiter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == len(STREAMED_WORDS) + 4, events[-3:]
        return STREAMED

    async def client_loop(http: httpx.AsyncClient, c: int) -> None:
        task = filler(400, f"stream/{c}" if stream else f"task/{c}")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        for i in counter:
            body = {"model": "fake", "messages": messages, "tools": tools, "max_tokens": 64, "user": f"{kind}-{c}"}
            messages = [*messages, await answer(http, body),
                        {"role": "tool", "tool_call_id": "call_0", "content": filler(300, f"obs/{c}/{i}")}]

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:
        await asyncio.gather(*(client_loop(http, c) for c in range(clients)))


async def drive_tools(url: str, calls: int, clients: int) -> None:
    from mcp import Client

    counter = iter(range(calls))
    async with Client(url + "/mcp") as mcp:
        names = [t.name for t in (await mcp.list_tools()).tools]
        echo = next(n for n in names if n.endswith("echo"))

        async def client_loop(c: int) -> None:
            for i in counter:
                await mcp.call_tool(echo, {"text": f"call {i}"}, meta={"agentbatch/sample": f"tools-{c}"})

        await asyncio.gather(*(client_loop(c) for c in range(clients)))


@contextmanager
def gateway_processes(tmp: Path, worker: str, probe: str, processes: int, db: str) -> Iterator[tuple[str, Any]]:
    """`agentbatch gateway --processes N` (N = 1: the plain command); yields its URL and process."""
    import yaml
    from gateway_overhead import free_port, process

    port = free_port()
    config = tmp / f"gateway-{processes}.yaml"
    config.write_text(yaml.safe_dump({"name": f"cluster-rate-{processes}", "scheduling": {
        "max_active_samples": 1024, "per_worker_inflight": 256, "env_slots": 64}, "engine": {
        "kind": "openai", "params": {"endpoints": [{"name": "w0", "base_url": worker, "model": "fake"}]}}}))
    args = ["-m", "agentbatch.flows.cli", "gateway", "--config", str(config), "--port", str(port), "--db", db,
            "--processes", str(processes), "--mcp", f"probe={probe}", "--no-prefect", "--no-progress"]
    base, log = f"http://127.0.0.1:{port}", tmp / f"gateway-{processes}.log"
    with ExitStack() as stack:
        try:
            proc = stack.enter_context(process(args, base + "/health", log))
        except RuntimeError:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise
        if processes > 1:  # every member up (the health check answers as soon as one is)
            wait_members(db, processes)
        yield base, proc


def wait_members(db: str, n: int, timeout_s: float = 180.0) -> None:
    from agentbatch.db.gateway_members import MEMBER_KIND
    from agentbatch.db.models import Worker
    from agentbatch.db.store import Store

    store, deadline = Store(db), time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with store.session() as s:
                rows = s.query(Worker).filter(Worker.kind == MEMBER_KIND).all()
            if len({r.name for r in rows if (r.metrics or {}).get("beat", 0) > time.time() - 5}) >= n:
                return
            time.sleep(0.2)
    finally:
        store.close()
    raise RuntimeError(f"{n} gateway processes did not come up")


def gateway_cpu_s(proc: Any) -> float:
    """CPU seconds of the gateway: the command's process and its member processes."""
    import psutil

    total = 0.0
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def measure_gateway(tmp: Path, probe: str, worker: str, args: argparse.Namespace, processes: int) -> dict[str, float]:
    db = args.db or f"sqlite:///{tmp / f'gateway-{processes}.sqlite'}"  # one store kind for every count
    out = {"inference": (0.0, 0.0), "streamed": (0.0, 0.0), "tools": (0.0, 0.0)}
    parts = (("inference", lambda: drive_inference(gw, 20, 4)),  # warm-up
             ("inference", lambda: drive_inference(gw, args.requests, args.clients)),
             ("streamed", lambda: drive_inference(gw, 20, 4, stream=True)),
             ("streamed", lambda: drive_inference(gw, args.streamed, args.clients, stream=True)),
             ("tools", lambda: drive_tools(gw, 20, 4)),
             ("tools", lambda: drive_tools(gw, args.tool_calls, args.clients)))
    counts = {"inference": args.requests, "streamed": args.streamed, "tools": args.tool_calls}
    with gateway_processes(tmp, worker, probe, processes, db) as (gw, proc):
        # --requests 0 / --streamed 0 / --tool-calls 0: that part is skipped, warm-up included
        for name, run in [(n, r) for n, r in parts if counts[n]]:
            before, wall = gateway_cpu_s(proc), time.perf_counter()
            asyncio.run(run())
            out[name] = (gateway_cpu_s(proc) - before, time.perf_counter() - wall)
    return {"req_cpu_s": out["inference"][0], "req_wall_s": out["inference"][1],
            "stream_cpu_s": out["streamed"][0], "stream_wall_s": out["streamed"][1],
            "tool_cpu_s": out["tools"][0], "tool_wall_s": out["tools"][1]}


# --- main -----------------------------------------------------------------------------------------------

def print_gateway(gws: dict[int, dict[str, float]], args: argparse.Namespace) -> tuple[float, float, str]:
    """The gateway's table; returns the rates of the fewest processes and the others' as text."""
    rates: dict[int, tuple[float, float]] = {}
    print("| gateway processes | chat requests | CPU s | ms/request | req/s per core | wall req/s | tool calls | "
          "CPU s | ms/call | calls/s per core | wall calls/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, gw in gws.items():
        rates[n] = (args.requests / max(gw["req_cpu_s"], 1e-9), args.tool_calls / max(gw["tool_cpu_s"], 1e-9))
        ms = [f"{1000 / r:.2f}" if r else "n/a" for r in rates[n]]
        print(f"| {n} | {args.requests} | {gw['req_cpu_s']:.2f} | {ms[0]} | {rates[n][0]:.0f} | "
              f"{args.requests / max(gw['req_wall_s'], 1e-9):.0f} | {args.tool_calls} | {gw['tool_cpu_s']:.2f} | "
              f"{ms[1]} | {rates[n][1]:.0f} | {args.tool_calls / max(gw['tool_wall_s'], 1e-9):.0f} |")
    print(f"gateway: {args.clients} clients; the gateway's CPU is that of all its processes; store: "
          f"{'PostgreSQL' if args.db else 'SQLite'}")
    more = "".join(f" ({n} processes: {rates[n][0]:.0f} req, {rates[n][1]:.0f} tool calls)" for n in rates if n != min(rates))
    return rates[min(rates)][0], rates[min(rates)][1], more


def print_streamed(gws: dict[int, dict[str, float]], args: argparse.Namespace) -> tuple[str, str]:
    """The gateway's streamed requests; returns the rate of the fewest processes and the others' as text."""
    rates = {n: args.streamed / gw["stream_cpu_s"] if gw["stream_cpu_s"] else 0.0 for n, gw in gws.items()}
    print("| gateway processes | streamed requests | CPU s | ms/request | streamed req/s per core | wall req/s |")
    print("|---|---|---|---|---|---|")
    for n, gw in gws.items():
        ms = f"{1000 / rates[n]:.2f}" if rates[n] else "n/a"
        print(f"| {n} | {args.streamed} | {gw['stream_cpu_s']:.2f} | {ms} | {rates[n]:.0f} | "
              f"{args.streamed / max(gw['stream_wall_s'], 1e-9):.0f} |")
    more = "".join(f" ({n} processes: {rates[n]:.0f})" for n in rates if n != min(rates))
    return (f"{rates[min(rates)]:.0f}" if rates[min(rates)] else "n/a"), more


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=24, help="samples of the recorded batch per mode")
    parser.add_argument("--requests", type=int, default=400, help="inference requests through the gateway (0: none)")
    parser.add_argument("--streamed", type=int, default=400,
                        help="streamed inference requests through the gateway, 64-token answers (0: none)")
    parser.add_argument("--tool-calls", type=int, default=400, help="tool calls through the gateway's /mcp (0: none)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent gateway clients")
    # steps last: its thousands of Prefect task runs keep the Prefect server busy for a while after the
    # batch, and a batch started then waits seconds for its flow run (wall time, and client CPU retrying)
    parser.add_argument("--modes", default="chains,lean,steps", help="execution modes of `run` to measure")
    parser.add_argument("--processes", default="1,2,4", help="gateway process counts to measure")
    parser.add_argument("--db", default=os.environ.get("AGENTBATCH_TEST_PG_URL"),
                        help="PostgreSQL store of the gateway runs (default: $AGENTBATCH_TEST_PG_URL; without one, "
                        "1 process on SQLite only)")
    parser.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return 0
    from agentbatch.db.store import Store

    load = os.getloadavg()
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="agentbatch-cluster-rate-") as tmpdir, ExitStack() as stack:
        tmp = Path(tmpdir)
        workers = [fake_worker(stack, tmp, f"fake-{i}") for i in range(2)]
        trace = long_trace(args.samples, tmp / "trace.parquet")
        store = Store(f"sqlite:///{tmp / 'runs.sqlite'}")
        if modes:  # the Prefect server up and the imports done before the first measured mode
            measure_run(store, long_trace(2, tmp / "warm.parquet"), workers, "steps")
        rows = {mode: measure_run(store, trace, workers, mode) for mode in modes}
        store.close()
        counts = [int(n) for n in args.processes.split(",") if n and (int(n) == 1 or args.db)]
        gws = {}
        if counts:  # --processes '': the runner only
            from gateway_makespan import probe_server

            probe = stack.enter_context(probe_server(tmp))
            gws = {n: measure_gateway(tmp, probe, workers[0], args, n) for n in counts}
    print(f"cluster rate: {args.samples} recorded mcp_like samples per mode (8 k-token system prompt, {TOOLS} tool "
          f"schemas) against 2 fake OpenAI-compatible workers that answer at once; SQLite store")
    print(f"machine: {os.cpu_count()} cores, load average before {load[0]:.2f} / after {os.getloadavg()[0]:.2f}")
    print("| run mode | steps | wall s | client CPU s | CPU ms/step | steps/s per core |")
    print("|---|---|---|---|---|---|")
    for mode, (wall, cpu, steps) in rows.items():
        print(f"| {mode} | {steps} | {wall:.2f} | {cpu:.2f} | {1000 * cpu / steps:.2f} | {steps / cpu:.0f} |")
    req, tools, more, streamed, streamed_more = "n/a", "n/a", "", "n/a", ""
    if gws:
        req_rate, tool_rate, more = print_gateway(gws, args)
        req, tools = f"{req_rate:.0f}", f"{tool_rate:.0f}"
        streamed, streamed_more = print_streamed(gws, args)

    def ms(mode: str) -> str:
        return f"{1000 * rows[mode][1] / rows[mode][2]:.2f}" if mode in rows else "n/a"

    print(f"runner ms/step {ms('chains')} (visible) {ms('lean')} (lean); gateway req/s/core {req}; "
          f"tool calls/s/core {tools}{more}; targets <= 2 / <= 1 ms, >= 1000, >= 2000; "
          f"streamed req/s/core {streamed}{streamed_more} (target >= 500)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
