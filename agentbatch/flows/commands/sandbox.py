"""`agentbatch sandbox ls|cleanup|tasks`: the Docker sandboxes agentbatch made, and the bash tasks."""

from __future__ import annotations

import argparse

from agentbatch.flows.commands._common import fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sandbox", help="list or remove agentbatch's Docker sandboxes; list the bash tasks",
        description="Every sandbox container carries the labels agentbatch.owner=agentbatch and "
        "agentbatch.batch=<label> (the bash_tasks workload's batch_label). `ls` lists them, `cleanup` removes "
        "the leftovers of one batch label (or of all with --all), for example after a crashed run; `tasks` lists "
        "the shipped repository-fixing tasks. See docs/sandbox.md.",
    )
    p.add_argument("action", choices=["ls", "cleanup", "tasks"])
    p.add_argument("--batch", metavar="LABEL", help="only containers with this agentbatch.batch label")
    p.add_argument("--all", action="store_true", help="cleanup: every agentbatch container, of any batch")
    p.add_argument("--host", action="append", metavar="URL",
                   help="Docker base URL (repeatable; default: $DOCKER_HOST or the local engine)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.action == "tasks":
        from agentbatch.environments.bash_tasks import catalog

        for t in catalog.TASKS:
            print(f"{t['id']:<18} {t['hint']}")
        return 0
    from agentbatch.protocols.environment import EnvironmentFailure

    if args.action == "cleanup" and not args.batch and not args.all:
        return fail("cleanup needs --batch LABEL or --all")
    hosts = args.host or [None]
    try:
        if args.action == "cleanup":
            _cleanup(None if args.all else args.batch, hosts)
        else:
            _list(args.batch, hosts)
    except EnvironmentFailure as exc:
        return fail(str(exc), 1)
    except Exception as exc:  # noqa: BLE001 - no engine: say so plainly
        return fail(f"Docker: {exc.__class__.__name__}: {exc}", 1)
    return 0


def _cleanup(batch: str | None, hosts: list[str | None]) -> None:
    from agentbatch.environments.docker_pool import cleanup_containers

    print(f"removed {cleanup_containers(batch, hosts)} container(s)")


def _list(batch: str | None, hosts: list[str | None]) -> None:
    from agentbatch.environments.docker_pool import docker_client, list_labelled

    for url in hosts:
        client = docker_client(url, 30, 4)
        try:
            for info in list_labelled(client, batch):
                labels = info.get("Labels") or {}
                print(f"{(url or 'default'):<10} {info['Names'][0].lstrip('/'):<50} {info['State']:<8} "
                      f"batch={labels.get('agentbatch.batch', '?')} sample={labels.get('agentbatch.sample', '?')}")
        finally:
            client.close()
