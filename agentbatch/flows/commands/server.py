"""`agentbatch server {start,stop,status}`: the local Prefect server that runs report to and reuse."""

from __future__ import annotations

import argparse

from agentbatch.flows.commands._common import fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "server", help="start, stop or show the local Prefect server that runs reuse",
        description="Without PREFECT_API_URL, `agentbatch run` reports to a local Prefect server that it starts "
        "once in the background (UI included) and that later runs reuse, so only the first run waits for it. "
        "This command starts it ahead of time, shows it, or stops it. Its address is kept in "
        "$AGENTBATCH_HOME/prefect-server.json (default ~/.agentbatch/). "
        "AGENTBATCH_PREFECT_SERVER=ephemeral makes runs use Prefect's temporary in-process server instead.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("action", choices=("start", "stop", "status"), help="what to do")
    p.add_argument("--port", type=int, default=4200, help="port for `start` (another free one when taken)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agentbatch.flows import prefect_server as ps

    if args.action == "stop":
        stopped = ps.stop_server()
        print(f"stopped the Prefect server at {stopped.url} (pid {stopped.pid})" if stopped
              else "no local Prefect server is recorded")
        return 0
    api = ps.running_server()
    if args.action == "status":
        print(f"Prefect server running at {api.url} (pid {api.pid}); UI at {ps.ui_url(api.url)}" if api
              else "no local Prefect server is running")
        return 0 if api else 1
    if api is None:
        if not 0 < args.port < 65536:
            return fail(f"--port {args.port}: expected a TCP port (1-65535)")
        api = ps.start_server(ps.free_port(args.port))
        try:
            ps.wait_ready(api)
        except RuntimeError as exc:
            return fail(str(exc), code=1)
    print(f"Prefect server running at {api.url} (pid {api.pid}); UI at {ps.ui_url(api.url)}; "
          f"runs without PREFECT_API_URL use it")
    return 0
