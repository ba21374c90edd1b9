"""`agentbatch gateway --config FILE`: serve the inference gateway and the MCP tool gateway as one batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbatch.flows.commands._common import add_db_option, fail
from agentbatch.flows.commands._gateway_processes import (
    GatewayStartError,
    chosen_config,
    member_settings,
    stored_config,
    supervise,
)
from agentbatch.flows.commands._launch import ready_prefect, start_prefect

if TYPE_CHECKING:
    from agentbatch.flows.prefect_server import PrefectApi


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway", help="serve an OpenAI-compatible gateway and an MCP tool gateway for an external harness",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Start one batch in the store and serve, until POST /v1/batch/finish or SIGTERM: the "
        "OpenAI-compatible inference gateway at http://HOST:PORT/v1 (chat completions incl. streaming, "
        "models, /health, /metrics) in front of the config's engine workers (engine.kind openai), and the "
        "MCP tool gateway (streamable HTTP) at http://HOST:PORT/mcp in front of the --mcp servers. Every "
        "request and tool call runs under the config's scheduling (admission, trajectory-aware routing, "
        "per-worker in-flight limits, environment slots ordered by CAAS) and is recorded as a step, so "
        "status, report and --compare work on the batch. With scheduling.policy auto (the default) the "
        "policy is chosen by simulation on the earlier finished batches of the same name, and a batch "
        "served by one process re-plans as its samples arrive. See docs/gateway.md.",
    )
    p.add_argument("--config", type=Path, required=True, help="batch config (.yaml/.toml); engine.kind must be "
                   "openai with engine.params.endpoints; the workload section is not used")
    add_db_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8100, help="TCP port")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name requests may name in their Host header, besides the --host address and "
                   "localhost (repeatable; '*': any, e.g. behind a proxy that checks it)")
    p.add_argument("--mcp", action="append", default=[], metavar="NAME=URL|NAME=COMMAND",
                   help="an upstream MCP server for the tool gateway: a streamable-HTTP URL or a command "
                   "started over stdio (repeatable)")
    p.add_argument("--mcp-per-sample", action="append", default=[], metavar="NAME",
                   help="the --mcp server NAME keeps state per session: each sample gets its own session "
                   "(opened on its first call, closed when it ends) instead of one shared (repeatable)")
    p.add_argument("--idle-timeout", type=float, default=300.0, metavar="S",
                   help="an admitted sample without a request or tool call for S seconds ends")
    p.add_argument("--no-end-on-answer", action="store_true",
                   help="an answer without tool calls does not end the sample (multi-turn harnesses that call "
                   "POST /v1/samples/ID/finish)")
    p.add_argument("--expect", type=int, default=None, metavar="N", help="samples expected (progress bar total; with scheduling.policy auto, the admission "
                   "limit of a chosen policy that admits every sample, else the largest earlier batch's samples)")
    p.add_argument("--harness-concurrency", type=int, default=None, metavar="N",
                   help="samples the harness runs at once (e.g. inspect_ai --max-samples), for scheduling.policy "
                   "auto, which simulates the policies on the earlier finished batches of the same name with the "
                   "samples sent N at a time (choosing and re-planning); default: as many as those batches show "
                   "(docs/gateway.md)")
    p.add_argument("--report", type=Path, metavar="DIR", help="write the HTML/PNG report to DIR at the end")
    p.add_argument("--no-prefect", action="store_true", help="no Prefect flow run (and no artifacts)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="serve with N processes on the one port (one batch: samples partitioned among them by a "
                   "hash of their id, the batch's limits split among them)")
    p.add_argument("--batch", type=int, default=None, metavar="ID",
                   help="join the running gateway batch ID as one more process (e.g. on another host, one "
                   "PostgreSQL store): its limits are split among all the batch's gateway processes")
    p.add_argument("--member", action="store_true", help=argparse.SUPPRESS)  # started by --processes
    p.set_defaults(func=main)


def _check(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any]] | str:
    """The config, worker endpoints and upstream specs; or the message of what is wrong."""
    from agentbatch.engines.openai_http import load_endpoints
    from agentbatch.flows.config import ConfigError, load_config
    from agentbatch.gateway.forward import WorkerEndpoint
    from agentbatch.gateway.tools import parse_upstream

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return str(exc)
    if config.engine.kind != "openai":
        return (f"{args.config}: engine.kind: the gateway forwards to HTTP workers; expected 'openai' "
                f"(with engine.params.endpoints), got {config.engine.kind!r}")
    try:
        endpoints = [WorkerEndpoint(e["name"], e["base_url"], e["model"], e.get("api_key"))
                     for e in load_endpoints(config.engine.params.get("endpoints"))]
        upstreams = [parse_upstream(text) for text in args.mcp]
    except (ValueError, OSError) as exc:
        return f"{args.config}: {exc}" if "--mcp" not in str(exc) else str(exc)
    if unknown := sorted(set(args.mcp_per_sample) - {u.name for u in upstreams}):
        return f"--mcp-per-sample: {', '.join(unknown)} not among the --mcp servers {[u.name for u in upstreams]}"
    if not 0 < args.port < 65536:
        return f"--port: expected 1..65535, got {args.port}"
    if problem := _number_problem(args):
        return problem
    return config, endpoints, upstreams


def _number_problem(args: argparse.Namespace) -> str | None:
    if args.idle_timeout <= 0:
        return f"--idle-timeout: expected seconds > 0, got {args.idle_timeout}"
    if args.processes < 1 or (args.processes > 1 and args.batch is not None):
        return f"--processes: expected 1..N processes (not with --batch), got {args.processes}"
    if args.harness_concurrency is not None and args.harness_concurrency < 1:
        return f"--harness-concurrency: expected a positive number of samples, got {args.harness_concurrency}"
    if args.expect is not None and args.expect < 1:
        return f"--expect: expected a positive number of samples, got {args.expect}"
    return None


def main(args: argparse.Namespace) -> int:
    checked = _check(args)
    if isinstance(checked, str):
        return fail(checked)
    options = {"host": args.host, "port": args.port, "expect": args.expect,
               "report": str(args.report) if args.report else None, "progress": not args.no_progress,
               "idle_timeout": args.idle_timeout, "end_on_answer": not args.no_end_on_answer,
               "allow_host": list(args.allow_host), "mcp_per_sample": list(args.mcp_per_sample),
               "batch": args.batch, "member": args.member, "harness": args.harness_concurrency}
    # The same Prefect server and secret handling as `run` (flows/launch.py); no server without Prefect.
    api = start_prefect(start_server=not args.no_prefect)
    if not args.no_prefect and (problem := ready_prefect(api, quiet=True)):
        return fail(problem, code=1)
    from agentbatch.db.engine import resolve_url

    db = resolve_url(args.db)

    async def serve() -> int:
        if args.processes > 1:
            return await supervise(args, checked, db, options)
        return await serve_gateway(checked, db, options)

    try:
        with asyncio.Runner(loop_factory=fast_loop()) as runner:
            if args.no_prefect:
                runner.run(serve())
            else:
                runner.run(gateway_flow(args, serve, db, options, api))
    except GatewayStartError as exc:
        return fail(str(exc))
    return 0


def fast_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (its socket and callback work is in C, where most of
    a proxied request's loop time goes); asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def serve_gateway(checked: tuple[Any, list[Any], list[Any]], db: str, options: dict[str, Any]) -> int:
    """Serve until finished, then print the batch's summary; returns the batch id. Progress bar and
    Prefect artifacts follow the samples."""
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import build_coordinator
    from agentbatch.gateway.server import Gateway, GatewayBatch, listen_socket, uvicorn_server
    from agentbatch.gateway.state import GatewaySettings

    config, endpoints, upstreams = checked
    # The store writer thread shares the interpreter lock with the event loop: every socket call of the
    # loop gives the lock up and may wait a whole switch interval (5 ms by default) to get it back.
    # A gateway process does little else, so switch ten times as often.
    sys.setswitchinterval(0.0005)
    joined = options.get("batch")
    sock, internal = _sockets(options, listen_socket)  # before the store is opened: an address in use leaves nothing
    from prefect.context import FlowRunContext

    run = FlowRunContext.get()
    store = Store(db)
    config, plan = await chosen_config(config, store, len(endpoints), options)
    batch = GatewayBatch(config.name, stored_config(config), batch_id=joined,
                         flow_run_id=str(run.flow_run.id) if run and run.flow_run else None)
    cluster, hosts = member_settings(options["host"], internal, tuple(options.get("allow_host") or ()))
    gateway = Gateway(store, build_coordinator(config, [e.name for e in endpoints]), endpoints,
                      batch=batch, upstreams=upstreams,
                      settings=GatewaySettings(idle_timeout_s=options["idle_timeout"],
                                               end_on_answer=options["end_on_answer"],
                                               retry=config.retries.policy(), bind_host=options["host"],
                                               allowed_hosts=hosts,
                                               per_sample_upstreams=tuple(options.get("mcp_per_sample") or ())),
                      cluster=cluster)
    server = uvicorn_server(gateway)
    beside = [asyncio.create_task(_watch(gateway, options))] if not options.get("member") else []
    beside += [asyncio.create_task(_replan(gateway, config, plan))] if plan is not None else []
    settle_heap()
    try:
        await server.serve(sockets=[sock] + ([internal] if internal is not None else []))
    finally:
        for task in beside:  # the watcher and re-planning end with the serving
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for s in (sock, internal):
            if s is not None:
                s.close()
    if not options.get("member"):  # the process that started the members reports the batch
        await _report(store, gateway.batch_id, options)
    store.close()
    return gateway.batch_id


async def _report(store: Any, batch_id: int, options: dict[str, Any]) -> None:
    """The batch's summary, its report (--report) and Prefect artifacts."""
    from agentbatch.dashboards.artifacts import publish_batch_artifacts
    from agentbatch.dashboards.report import write_report
    from agentbatch.dashboards.summary import summarize

    report = Path(options["report"]) if options["report"] else None
    report_path = write_report(store, [batch_id], report) if report is not None else None
    await publish_batch_artifacts(store, batch_id, report_path=report_path)
    print(summarize(store, batch_id).to_text())
    if report_path:
        print(f"report: {report_path}")


async def _replan(gateway: Any, config: Any, plan: Any) -> None:
    """Re-plan the batch while it is served (flows/replan.py), its clock started by the first sample;
    until cancelled. The samples take their priors from the history as they arrive, whatever runs."""
    from agentbatch.flows.commands._gateway_processes import stored_config
    from agentbatch.flows.policy_choice import engine_model
    from agentbatch.flows.replan import LiveTarget, replanning
    from agentbatch.scheduling.portfolio import running_policy_status

    while not gateway.opened:
        await asyncio.sleep(0.05)
    model = engine_model(config)
    assert model is not None  # policy auto chose: the engines' timing is known

    def stored(switched: Any) -> dict[str, Any]:
        data = stored_config(switched)
        gateway.state.policy = running_policy_status(data)  # GET /v1/batch names what runs now
        return data

    target = LiveTarget(gateway.store, gateway.batch_id, config, gateway.coordinator, lambda: 1, None, {}, {}, {},
                        [e.name for e in gateway.endpoints], dict(config.scheduling.choice or {}), stored=stored)
    async with replanning(plan, model[1], target, started=lambda: bool(gateway.state.registry.samples)):
        await asyncio.Event().wait()


def settle_heap() -> None:
    """Move what the process has built so far (the imports, the app: some 300,000 objects) out of the
    garbage collector's sight: it lives as long as the process, and every full collection walked all
    of it (about 150 ms of CPU, one per few thousand requests, the first soon after start)."""
    gc.collect()
    gc.freeze()


def _sockets(options: dict[str, Any], listen_socket: Callable[..., Any]) -> tuple[Any, Any]:
    """The public socket (shared when this process is one of several serving a batch) and, then, the
    internal one the others forward to."""
    joined = options.get("batch") is not None
    try:
        sock = listen_socket(options["host"], options["port"], shared=joined)
        return sock, listen_socket(options["host"], 0) if joined else None
    except OSError as exc:
        raise GatewayStartError(f"--host/--port: cannot listen on {options['host']}:{options['port']}: {exc}") from exc


async def _watch(gateway: Any, options: dict[str, Any]) -> None:
    """Announce the endpoints once open; then a progress bar, the Prefect progress artifact and the
    batch's heartbeat."""
    from tqdm import tqdm

    from agentbatch.dashboards.artifacts import BatchProgressArtifact
    from agentbatch.dashboards.choice import running_policy
    from agentbatch.flows.progress import HEARTBEAT_S

    while not gateway.opened:
        await asyncio.sleep(0.05)
    base = f"http://{options['host']}:{options['port']}"
    from agentbatch.flows.store_url import shown_url

    print(f"agentbatch gateway: batch {gateway.batch_id} in {shown_url(str(gateway.store.url))}\n"
          f"  OpenAI base URL {base}/v1   MCP tool gateway {base}/mcp ({len(gateway.tools.tools)} tools)\n"
          f"  policy {running_policy(gateway.batch.config)}\n"
          f"  finish with: curl -X POST {base}/v1/batch/finish   (or SIGTERM)", flush=True)
    registry = gateway.state.registry
    bar = tqdm(total=options["expect"], desc=f"gateway batch {gateway.batch_id}", unit="sample",
               disable=None if options["progress"] else True)
    artifact = BatchProgressArtifact()
    await artifact.start(gateway.batch_id, options["expect"] or 0)
    beat_at = time.monotonic()
    try:
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - beat_at >= HEARTBEAT_S:  # alive: `status` reads a batch without beats crashed
                beat_at = time.monotonic()
                await asyncio.to_thread(gateway.store.heartbeat, gateway.batch_id)
            done = sum(1 for s in registry.samples.values() if s.ends and not s.admitted)
            if not options["expect"]:
                bar.total = artifact.total = len(registry.samples)
            bar.n = done
            bar.set_postfix(active=registry.active, refresh=False)
            bar.refresh()
            await artifact.update(done)
    finally:
        bar.close()
        await artifact.flush()


async def gateway_flow(args: argparse.Namespace, serve: Callable[[], Awaitable[int]], db: str,
                       options: dict[str, Any], api: PrefectApi) -> int:
    """The gateway as a Prefect flow run (`agentbatch-gateway`), with the batch's artifacts, started
    as every run is (`flows/launch.py`: the store URL recorded without its password)."""
    from prefect import flow

    from agentbatch.flows.launch import launch_flow

    @flow(name="agentbatch-gateway", validate_parameters=False, persist_result=False, log_prints=False)
    async def agentbatch_gateway(config_path: str, mcp: list[str], db_url: str, options: dict[str, Any]) -> int:
        return await serve()  # the config as checked, the store URL as given

    params = {"config_path": str(args.config), "mcp": list(args.mcp), "db_url": db, "options": options}
    return int(await launch_flow(agentbatch_gateway, params, api=api))
