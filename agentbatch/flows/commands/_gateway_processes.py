"""`agentbatch gateway --processes N`: N gateway processes serving one batch on one port.

This process creates the batch (and registers its workers), starts N member processes
(`agentbatch gateway --batch ID`, listening on the same port with SO_REUSEPORT), passes SIGINT and
SIGTERM on to them and waits for them; the last member to leave finishes the batch
(`gateway/cluster.py`). A gateway host elsewhere joins the same batch with `--batch ID`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import Any

from agentbatch.db.models import BatchStatus

log = logging.getLogger("agentbatch.gateway")


class GatewayStartError(Exception):
    """The gateway cannot start (address in use): nothing was written."""


def stored_config(config: Any) -> dict[str, Any]:
    """The config as the batch records it: API keys of the endpoints are not stored."""
    data = config.model_dump(mode="json")
    endpoints = data["engine"]["params"].get("endpoints")
    if isinstance(endpoints, list):
        for endpoint in endpoints:
            if isinstance(endpoint, dict) and endpoint.get("api_key"):
                endpoint["api_key"] = "(not stored)"
    return data


def member_settings(host: str, internal: Any, hosts: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    """A member's cluster settings (its internal URL, which the other members forward to) and the
    hosts its requests may name (the name it is reached by, when it listens on every address); no
    settings when the process serves its batch alone (no internal socket)."""
    import socket

    from agentbatch.gateway.cluster import ClusterSettings

    if internal is None:
        return None, hosts
    internal_port = internal.getsockname()[1]
    name = socket.gethostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{name}]" if ":" in name else name
    return ClusterSettings(url=f"http://{shown}:{internal_port}"), (*hosts, name)


def served_config(config: Any, store: Any, workers: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any] | None, Any]:
    """The config a gateway process serves with, what `scheduling.policy: auto` chose (None when it
    did not run) and what the batch re-plans with (None: it does not): a process joining a batch
    runs the batch's stored scheduling (what the process that opened it chose); the one that opens a
    batch applies `scheduling.policy` (flows/policy_choice.py `choose_gateway_policy`)."""
    joined = options.get("batch")
    if joined is not None:
        batch = store.get_batch(joined)
        stored = (batch.config or {}).get("scheduling") if batch is not None else None
        if not isinstance(stored, dict):
            return config, None, None
        scheduling = type(config.scheduling).model_validate(stored)
        return config.model_copy(update={"scheduling": scheduling}), None, None
    from agentbatch.flows.policy_choice import choose_gateway_policy

    choice = choose_gateway_policy(config, store, workers, harness=options.get("harness"), expect=options.get("expect"))
    return choice.config, choice.summary, choice.plan


async def chosen_config(config: Any, store: Any, workers: int, options: dict[str, Any]) -> tuple[Any, Any]:
    """`served_config`'s config and re-planning plan, its choice published as the flow run's artifact
    (`policy-choice`)."""
    from agentbatch.flows.policy_choice import publish_choice

    config, choice, plan = served_config(config, store, workers, options)
    if choice is not None:
        await publish_choice(choice)
    return config, plan


MEMBERS_LOST = "every gateway process exited without finishing the batch"


def member_argv(args: argparse.Namespace, batch_id: int) -> list[str]:
    """The command line of one member process (the store URL goes in its environment, not its argv)."""
    argv = [sys.executable, "-m", "agentbatch.flows.cli", "gateway", "--config", str(args.config),
            "--host", args.host, "--port", str(args.port), "--batch", str(batch_id), "--member",
            "--no-prefect", "--no-progress", "--idle-timeout", str(args.idle_timeout)]
    argv += ["--no-end-on-answer"] if args.no_end_on_answer else []
    for flag, values in (("--allow-host", args.allow_host), ("--mcp", args.mcp), ("--mcp-per-sample", args.mcp_per_sample)):
        for value in values:
            argv += [flag, value]
    return argv


async def supervise(args: argparse.Namespace, checked: tuple[Any, list[Any], list[Any]], db: str,
                    options: dict[str, Any]) -> int:
    """Create the batch, run the members until they end, print the batch's summary; returns its id."""
    from prefect.context import FlowRunContext

    from agentbatch.dashboards.report import write_report
    from agentbatch.dashboards.summary import summarize
    from agentbatch.db.store import Store
    from agentbatch.gateway.server import listen_socket, open_gateway_batch

    config, endpoints, _ = checked
    try:  # the port must be free (or shared by gateway processes) before anything is written
        listen_socket(options["host"], options["port"], shared=True).close()
    except OSError as exc:
        raise GatewayStartError(f"--host/--port: cannot listen on {options['host']}:{options['port']}: {exc}") from exc
    run = FlowRunContext.get()
    store = Store(db)
    config, plan = await chosen_config(config, store, len(endpoints), options)
    if plan is not None:
        log.info("gateway %r: served by %d processes, the batch does not re-plan while it runs (one "
                 "process would have to decide for all)", config.name, args.processes)
    batch_id = open_gateway_batch(store, config.name, stored_config(config), endpoints,
                                  str(run.flow_run.id) if run and run.flow_run else None)
    env = {**os.environ, "AGENTBATCH_DB_URL": db}
    procs = [subprocess.Popen(member_argv(args, batch_id), env=env) for _ in range(args.processes)]
    base = f"http://{options['host']}:{options['port']}"
    print(f"agentbatch gateway: batch {batch_id}, {args.processes} processes\n"
          f"  OpenAI base URL {base}/v1   MCP tool gateway {base}/mcp\n"
          f"  finish with: curl -X POST {base}/v1/batch/finish   (or SIGTERM)", flush=True)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        codes = [await asyncio.to_thread(p.wait) for p in procs]
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        stop()
    batch = store.get_batch(batch_id)
    if batch is not None and batch.status == BatchStatus.RUNNING:  # none of them got to finish it
        store.finish_batch(batch_id, BatchStatus.FAILED, f"{MEMBERS_LOST} (exit codes {codes})")
    report_path = write_report(store, [batch_id], options["report"]) if options["report"] else None
    print(summarize(store, batch_id).to_text())
    if report_path:
        print(f"report: {report_path}")
    store.close()
    return batch_id
