"""`agentbatch serve [NAME ...]`: run the scheduled evals registered with `agentbatch deploy`."""

from __future__ import annotations

import argparse

from agentbatch.flows.commands._common import fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run scheduled evals (the deployments of `agentbatch deploy`) on this machine",
        description="Poll the Prefect server (PREFECT_API_URL) for due runs of the named deployments (all "
        "agentbatch deployments without a work pool when none are named) and run each in a subprocess, "
        "until stopped with Ctrl-C or SIGTERM. Their schedules are active while this runs and paused "
        "when it stops. Deployments on a work pool run under `prefect worker start --pool POOL` instead.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="deployment names (default: all)")
    p.add_argument("--limit", type=int, default=1,
                   help="runs at once; 1 keeps scheduled evals from competing for the same engine workers "
                   "(and lets each run use the previous one's priors); 0 = no limit (default 1)")
    p.add_argument("--poll", type=float, default=10.0, metavar="SECONDS", help="how often to ask for due runs (default 10)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import asyncio

    from agentbatch.flows.commands.deploy import pick_server, server_ready

    if args.limit < 0 or args.poll <= 0:
        return fail("--limit must be 0 or more and --poll positive")
    api = pick_server()
    if problem := api if isinstance(api, str) else server_ready(api):
        return fail(problem)
    from agentbatch.flows.deployments import FLOW_NAME, serve, served_deployments

    deployments, unknown = asyncio.run(served_deployments(args.names))
    if unknown:
        return fail(f"no deployment of {FLOW_NAME} without a work pool named: {', '.join(unknown)} "
                    "(register it with `agentbatch deploy`)")
    if not deployments:
        return fail(f"no deployment of {FLOW_NAME} to serve; register one with `agentbatch deploy`")
    print(f"serving {', '.join(d.name for d in deployments)} (at most {args.limit or 'any number of'} run(s) at "
          "once); Ctrl-C stops", flush=True)
    try:
        asyncio.run(serve(deployments, limit=args.limit or None, poll_s=args.poll))
    except KeyboardInterrupt:
        return 130
    return 0
