"""The same recorded workload driven by an external agent loop, directly and through the gateways.

A 100-sample trace (the `mcp_like` family: chains of inference and tool calls; written to Parquet
and read back, as a recorded batch would be) is replayed by a plain loop on the `openai` SDK and an
MCP client: each inference request asks for the recorded number of output tokens and gets back an
assistant message that calls the `sleep` tool for the recorded environment time; the loop runs
that call on an MCP server (the probe server, over streamable HTTP) and sends the next request.

- direct: the competent baseline without agentbatch: every sample starts at once, a sample always
  goes to the same worker (session affinity by hash), and the loop guards the tool server with a
  semaphore of `env_slots` (decoupled FIFO).
- gateways: the same loop pointed at `agentbatch gateway` (base URL /v1, tools at /mcp): admission,
  trajectory-aware routing, chain-progress priority and CAAS on the environment slots; the loop
  has no semaphore of its own, and ends each sample with `POST /v1/samples/{id}/finish` (a recorded
  chain may end on a tool call rather than a final answer, which would leave the sample to the
  idle timeout).

The inspect_ai row (`--harness inspect` or `both`, `gateway_inspect_row.py`) runs the same samples as
an inspect_ai task: (a) inspect as a competent user sets it up (all samples at once, affinity by
hash, one semaphore around the tools) and (b) the unchanged task through the gateways with the
`agentbatch/<model>` provider of integrations/inspect_agentbatch; it checks that both produce the
same trajectories and scores and prints the makespan ratio b/a.

Fresh simulated workers (`serve-sim`, real time scaled by --time-scale) for each run, so neither
finds the other's prefix cache. Prints the makespan of each and their ratio, measured in one run.

    .venv/bin/python bench/gateway_makespan.py [--samples 100] [--time-scale 0.25] [--harness both]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from gateway_overhead import MODEL, free_port, gateway, process, sim_worker
from mcp import Client
from openai import AsyncOpenAI

from agentbatch.traces.conversation import assistant_message, filler, initial_messages
from agentbatch.traces.generators import generate, get_family
from agentbatch.traces.parquet import read_trace, write_trace
from agentbatch.traces.schema import INFERENCE, TraceSample


def scripted_answer(sample: TraceSample, k: int, env_scale: float) -> dict[str, Any]:
    """The recorded assistant turn of step k; it calls `sleep` when an environment step follows."""
    step = sample.steps[k]
    message = assistant_message(sample, step)
    following = sample.steps[k + 1] if k + 1 < len(sample.steps) else None
    if following is not None and following.kind != INFERENCE:
        message["tool_calls"] = [{"id": f"call_{k}", "type": "function", "function": {
            "name": "sleep", "arguments": json.dumps({"seconds": round(following.duration_s * env_scale, 4)})}}]
    return message


class Tools:
    """The loop's tool side: one MCP session shared by all samples, an optional FIFO semaphore."""

    def __init__(self, client: Client, slots: int | None, via_gateway: bool) -> None:
        self.client = client
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.via_gateway = via_gateway

    async def call(self, sample: str, name: str, arguments: dict[str, Any]) -> str:
        meta = {"agentbatch/sample": sample} if self.via_gateway else None
        async with self.slots or contextlib.nullcontext():
            result = await self.client.call_tool(name, arguments, meta=meta)
        return "\n".join(getattr(c, "text", "") for c in result.content)


async def run_sample(sample: TraceSample, openai: AsyncOpenAI, tools: Tools, env_scale: float,
                     worker_for: str | None) -> None:
    key = f"{sample.task_id}#{sample.index}"
    messages = initial_messages(sample)
    for k, step in enumerate(sample.steps):
        if step.kind != INFERENCE:
            continue
        extra: dict[str, Any] = {"ignore_eos": True, "agentbatch_response": scripted_answer(sample, k, env_scale)}
        response = await openai.chat.completions.create(
            model=worker_for or MODEL, messages=messages, max_tokens=max(1, step.output_tokens or 1), user=key,
            extra_body=extra)
        message = response.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            await tools.call(key, call["function"]["name"], json.loads(call["function"]["arguments"]))
            obs = sample.steps[k + 1].obs_tokens or 1
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": filler(obs, f"obs/{sample.index}/{k + 1}")})


async def drive(samples: list[TraceSample], workers: list[str], mcp_url: str, env_scale: float, *,
                gateway_url: str | None, env_slots: int, window: int | None = None) -> float:
    """Run every sample, at most `window` at once in their order (None: all at once); returns the
    makespan (s)."""
    # The SDK's default retries stay on: a worker closes idle keep-alive connections, and a request
    # may meet one being closed.
    clients = [AsyncOpenAI(base_url=(gateway_url + "/v1") if gateway_url else w, api_key="unused", timeout=1800)
               for w in ([gateway_url] if gateway_url else workers)]
    async with Client(mcp_url) as mcp:
        tools = Tools(mcp, None if gateway_url else env_slots, via_gateway=gateway_url is not None)
        start = time.perf_counter()
        harness = asyncio.Semaphore(window or len(samples))  # FIFO: samples start in their order

        async def one(sample: TraceSample) -> None:
            async with harness:
                await run_one(sample)

        async def run_one(sample: TraceSample) -> None:
            # Direct: session affinity, a sample always on the same worker.
            client = clients[0] if gateway_url else clients[zlib.crc32(sample.task_id.encode()) % len(clients)]
            await run_sample(sample, client, tools, env_scale, None)
            if gateway_url:  # a recorded chain may end on a tool call: say the sample is done
                await client.post(f"/samples/{sample.task_id}%23{sample.index}/finish", cast_to=object, body={})

        await asyncio.gather(*(one(s) for s in samples))
        makespan = time.perf_counter() - start
    for c in clients:
        await c.close()
    return makespan


@contextlib.contextmanager
def probe_server(tmp: Path) -> Iterator[str]:
    port = free_port()
    args = ["-m", "agentbatch.environments.mcp_servers.probe_server", "--http", f"127.0.0.1:{port}"]
    with process(args, f"http://127.0.0.1:{port}/mcp", tmp / "probe.log", any_status=True):
        yield f"http://127.0.0.1:{port}/mcp"


def run_mode(samples: list[TraceSample], args: argparse.Namespace, tmp: Path, via_gateway: bool,
             caps: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    mode = tmp / ("gateway" if via_gateway else "direct")
    mode.mkdir()
    with contextlib.ExitStack() as stack:
        workers = {f"w{i}": stack.enter_context(sim_worker(mode, f"w{i}", args.time_scale, args.profile))
                   for i in range(caps["workers"])}
        probe = stack.enter_context(probe_server(mode))
        gw = None
        if via_gateway:
            scheduling = {"max_active_samples": caps["max_active"], "env_slots": caps["env_slots"],
                          "per_worker_inflight": args.per_worker_inflight}
            gw = stack.enter_context(gateway(mode, workers, scheduling, [f"probe={probe}"]))
        makespan = asyncio.run(drive(samples, list(workers.values()), gw + "/mcp" if gw else probe,
                                     args.env_scale, gateway_url=gw, env_slots=caps["env_slots"]))
        hits = {}
        for name, url in workers.items():
            text = httpx.get(url.removesuffix("/v1") + "/metrics").text
            values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("vllm:prefix_cache")}
            hits[name] = values.get("vllm:prefix_cache_hits_total", 0) / max(1.0, values.get(
                "vllm:prefix_cache_queries_total", 1.0))
        status = httpx.get(gw + "/v1/batch").json() if gw else {}
    return makespan, {"hit_rate": hits, **({"sticky": status.get("sticky"), "moves": status.get("moves"),
                                            "peaks": status.get("peaks")} if status else {})}


def run_inspect_mode(samples: list[TraceSample], args: argparse.Namespace, tmp: Path, via_gateway: bool,
                     caps: dict[str, Any]) -> tuple[float, Any, dict[str, Any]]:
    """The inspect_ai task, direct or through the gateways; (makespan, eval log, what the gateway saw)."""
    from gateway_inspect_row import replay_task, run_inspect

    mode = tmp / ("inspect-gateway" if via_gateway else "inspect-direct")
    mode.mkdir()
    with contextlib.ExitStack() as stack:
        workers = {f"w{i}": stack.enter_context(sim_worker(mode, f"w{i}", args.time_scale, args.profile))
                   for i in range(caps["workers"])}
        probe = stack.enter_context(probe_server(mode))
        gw = None
        if via_gateway:
            scheduling = {"max_active_samples": caps["max_active"], "env_slots": caps["env_slots"],
                          "per_worker_inflight": args.per_worker_inflight}
            gw = stack.enter_context(gateway(mode, workers, scheduling, [f"probe={probe}"]))
        task = replay_task(samples, args.env_scale, workers=None if gw else list(workers.values()),
                           probe_url=None if gw else probe, env_slots=caps["env_slots"], epochs=args.epochs)
        makespan, log = run_inspect(task, mode / "logs", gateway_url=gw, n_samples=len(samples) * args.epochs)
        status = httpx.get(gw + "/v1/batch").json() if gw else {}
    seen: dict[str, Any] = {}
    if via_gateway:
        from agentbatch.db.store import Store

        store = Store(f"sqlite:///{mode / 'gateway.sqlite'}")
        rows = store.samples(store.list_batches()[0].id)
        seen = {"samples in the store": len(rows), "ended by inspect's finish": sum(
            1 for r in rows if (r.result or {}).get("ended") == "finish"), "yielded": status.get("yielded")}
    return makespan, log, seen


def inspect_row(samples: list[TraceSample], args: argparse.Namespace, tmp: Path, caps: dict[str, Any]) -> None:
    from gateway_inspect_row import trajectories

    direct, d_log, _ = run_inspect_mode(samples, args, tmp, False, caps)
    through, g_log, seen = run_inspect_mode(samples, args, tmp, True, caps)
    a, b = trajectories(d_log), trajectories(g_log)
    same = sum(1 for k in a if b.get(k) == a[k])
    print(f"inspect_ai ({args.epochs} epoch(s), {len(a)} samples): identical trajectories and scores in {same} of "
          f"{len(a)}; mean score direct {d_log.results.scores[0].metrics['mean'].value:.3f}, through the gateways "
          f"{g_log.results.scores[0].metrics['mean'].value:.3f}; gateway {seen}")
    print(f"inspect_ai direct (all samples at once, affinity by hash, tool semaphore): makespan {direct:7.1f} s")
    print(f"inspect_ai through the gateways (agentbatch/<model>, /mcp):             makespan {through:7.1f} s")
    print(f"inspect_ai makespan ratio gateways / direct (b/a): {through / direct:.3f}")
    if same != len(a):
        raise SystemExit("the two inspect runs differ in trajectories or scores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--family", default="mcp_like")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="llama3-8b-h100", help="simulated worker profile")
    parser.add_argument("--time-scale", type=float, default=0.25, help="wall seconds per engine second")
    parser.add_argument("--env-scale", type=float, default=0.25, help="factor on recorded tool times")
    parser.add_argument("--per-worker-inflight", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and the store here (default: temp)")
    parser.add_argument("--harness", choices=["loop", "inspect", "both"], default="both",
                        help="the plain openai loop, the inspect_ai task, or both")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of the inspect_ai task")
    args = parser.parse_args()
    caps = dict(get_family(args.family).capacities)
    load = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentbatch-gw-makespan-")))
        else:
            tmp = args.workdir
            tmp.mkdir(parents=True, exist_ok=False)
        path = write_trace(generate(args.family, args.samples, seed=args.seed), tmp / "recorded.parquet")
        samples = read_trace(path).samples
        steps = sum(len(s.steps) for s in samples)
        print(f"recorded workload: {args.samples} samples of {args.family} (seed {args.seed}), {steps} steps; "
              f"{caps['workers']} simulated workers ({args.profile}, time scale {args.time_scale}), tool times x "
              f"{args.env_scale}, {caps['env_slots']} environment slots, gateway admission {caps['max_active']}")
        if args.harness in ("loop", "both"):
            direct, d_info = run_mode(samples, args, tmp, False, caps)
            through, g_info = run_mode(samples, args, tmp, True, caps)
            print(f"direct (affinity by hash, all admitted, FIFO tool semaphore): makespan {direct:7.1f} s   {d_info}")
            print(f"through the gateways (agentbatch coordination):             makespan {through:7.1f} s   {g_info}")
            print(f"makespan ratio gateways / direct: {through / direct:.3f}")
        if args.harness in ("inspect", "both"):
            inspect_row(samples, args, tmp, caps)
    print(f"machine: {os.cpu_count()} cores, load average before {load[0]:.2f} / after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
