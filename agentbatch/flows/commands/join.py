"""`agentbatch join BATCH_ID`: one more worker process on a batch that others may be running too;
`agentbatch join BATCH_ID --work-pool POOL [--workers N]`: N workers as flow runs of a Prefect work pool.

Every worker of a batch (on this machine or on others, all pointed at the same PostgreSQL store)
takes unfinished samples in chunks under sample leases (`db/leases.py`), runs them, and takes the
next chunk, until none is left. A worker that dies (SIGKILL, a lost machine) stops renewing its
leases: once they expire, or at once when the dead process was on the same host, the others take its
samples over and continue them from their last committed step. Each worker is one Prefect flow run of
`agentbatch-join` (`flows/join.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from agentbatch.flows.commands._common import add_db_option, fail
from agentbatch.flows.commands._inputs import stored_config_error
from agentbatch.flows.commands._launch import ready_prefect, start_prefect
from agentbatch.flows.commands._outcome import batch_problem
from agentbatch.flows.store_url import shown_url

if TYPE_CHECKING:
    from agentbatch.flows.prefect_server import PrefectApi

DEFAULT_CHUNK = 64
DEFAULT_WORKERS = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "join", help="add workers to a batch (scale-out over one PostgreSQL store)",
        description="Work on BATCH_ID beside any other process that runs it: claim up to --chunk unfinished "
        "samples under a lease, run them, claim more, until every sample is finished. Start one per core or "
        "machine against the same PostgreSQL store (--db or AGENTBATCH_DB_URL). Samples of a process that "
        "died are taken over once its leases expire (at once for a dead process on this host). Exit 0 when "
        "the batch is finished, 1 when samples failed, 2 on bad input. "
        "With --work-pool POOL this process runs nothing: it registers (or updates) the deployment "
        "agentbatch-join/batch-BATCH_ID-STORE (STORE: 8 hex digits naming the store) on that Prefect work pool, creates --workers flow runs of it and "
        "exits; `prefect worker start --pool POOL` on each machine runs them. That needs a running Prefect "
        "server (PREFECT_API_URL, or `agentbatch server start`) and the pool on it. The store URL is kept on "
        "the server without its password: each worker machine sets AGENTBATCH_SECRET_DB_URL_PASSWORD (or "
        "AGENTBATCH_DB_URL to the full URL of the same database).",
    )
    p.add_argument("batch_id", type=int, help="the batch to work on (the id `agentbatch run` printed)")
    add_db_option(p)
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"samples claimed at a time (default {DEFAULT_CHUNK}; a few times "
                        "scheduling.max_active_samples keeps the process busy)")
    p.add_argument("--poll", type=float, default=5.0,
                   help="seconds between looks for work while other processes hold every unfinished "
                        "sample (default 5.0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--work-pool", default=None, metavar="POOL",
                   help="run the workers as flow runs of this Prefect work pool instead of in this process "
                        "(default: none, this process is the worker)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="N",
                   help=f"with --work-pool: flow runs to create, each one worker (default {DEFAULT_WORKERS})")
    p.set_defaults(func=main)


def _args_problem(args: argparse.Namespace) -> str | None:
    if args.chunk < 1:
        return f"--chunk: expected a number of samples >= 1, got {args.chunk}"
    if not args.poll > 0:
        return f"--poll: expected seconds > 0, got {args.poll}"
    if args.workers < 1:
        return f"--workers: expected a number of flow runs >= 1, got {args.workers}"
    if args.workers != DEFAULT_WORKERS and not args.work_pool:
        return "--workers: only with --work-pool (without it this process is one worker)"
    if args.work_pool is not None and not args.work_pool.strip():
        return "--work-pool: expected a work pool name, got an empty string"
    return None


def main(args: argparse.Namespace) -> int:
    if problem := _args_problem(args):
        return fail(problem)
    if problem := _store_problem(args.db):
        return fail(problem)
    # Chosen before Prefect is imported (its settings); a work pool needs a server that is running.
    api = start_prefect(start_server=not args.work_pool)
    if problem := (_server_problem(api) if args.work_pool else ready_prefect(api, quiet=True)):
        return fail(problem)
    from agentbatch.db.store import Store

    store = Store(args.db)
    try:
        row = store.get_batch(args.batch_id)
        if row is None:
            return fail(f"no batch {args.batch_id} in {shown_url(store.url)}")
        if error := stored_config_error(row.config, args.batch_id):
            return fail(error)
        if args.work_pool:  # the secret references are resolved on the workers' machines
            return _deploy(args, store, row.name, row.config)
        if error := batch_problem(store, args.batch_id):  # a secret reference not set here
            return fail(error)
        return _run_here(args, store, api, row.name)
    finally:
        store.close()


def _store_problem(db: str | None) -> str | None:
    """The store must exist and answer: a worker never creates one."""
    from agentbatch.db.engine import resolve_url, sqlite_path
    from agentbatch.flows.commands._inputs import db_reachable_error

    url = resolve_url(db)
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return f"--db: no store at {path} (join works on a batch created by `agentbatch run` or `resume`)"
    return db_reachable_error(url)


def _run_here(args: argparse.Namespace, store: Any, api: PrefectApi, batch_name: str) -> int:
    from agentbatch.flows.identity import batch_tags, flow_run_name
    from agentbatch.flows.join import join_flow
    from agentbatch.flows.launch import launch_flow

    started = time.perf_counter()
    params = {"batch_id": args.batch_id, "db_url": store.url, "chunk": args.chunk, "poll_s": args.poll,
              "show_progress": False if args.no_progress else None}
    result = asyncio.run(launch_flow(join_flow, params, api=api, tags=batch_tags(store.url, args.batch_id),
                                     run_name=f"{flow_run_name(args.batch_id, batch_name)}-join"))
    print(f"batch {args.batch_id}: finished after {time.perf_counter() - started:.1f} s here "
          f"({result['chunks']} chunk(s) run by this process); {result['completed']} completed, "
          f"{result['failed']} failed", flush=True)
    return 1 if result["failed"] else 0


def _server_problem(api: PrefectApi) -> str | None:
    """A work pool lives on a running Prefect server: PREFECT_API_URL, or agentbatch's local server
    when it runs (never started here, never Prefect's temporary one: workers could not reach it)."""
    from agentbatch.flows.commands.deploy import SERVER_HINT, api_silent

    if api.url is None:
        return f"--work-pool: no Prefect server to register the workers on; {SERVER_HINT}"
    problem = api_silent(api.url)
    return f"--work-pool: {problem}" if problem else None


def _deploy(args: argparse.Namespace, store: Any, batch_name: str, row_config: dict[str, Any]) -> int:
    from agentbatch.flows.join import (
        JoinDeployment,
        deploy_join,
        unfinished,
        work_pool_problem,
        worker_variables,
    )

    if problem := work_pool_problem(args.work_pool):
        return fail(problem)
    if not unfinished(store, args.batch_id):
        print(f"batch {args.batch_id}: every sample is finished; no flow run created")
        return 0
    spec = JoinDeployment(batch_id=args.batch_id, batch_name=batch_name, db_url=store.url, work_pool=args.work_pool,
                          workers=args.workers, chunk=args.chunk, poll_s=args.poll)
    try:
        done = deploy_join(spec)
    except ValueError as exc:
        return fail(f"cannot register the deployment: {exc}")
    print(f"deployment {done.deployment} ({done.deployment_id}) on work pool {args.work_pool}, store "
          f"{shown_url(store.url)}; {len(done.flow_runs)} flow run(s) created:")
    for name, run_id in done.flow_runs:
        print(f"  {name} ({run_id})")
    print(_worker_hint(store.url, args.work_pool, worker_variables(row_config, spec.parameters()["db_url"])),
          flush=True)
    return 0


def _worker_hint(store_url: str, pool: str, needed: list[str]) -> str:
    """How to start the pool's workers: the command, and the variables each machine sets."""
    from agentbatch.flows.store_url import DB_PASSWORD_VARIABLE

    notes = ["agentbatch installed, the store and the Prefect server reachable"]
    if local := _local_note(store_url):
        notes.append(local)
    if needed:
        instead = f" (AGENTBATCH_DB_URL may replace {DB_PASSWORD_VARIABLE})" if DB_PASSWORD_VARIABLE in needed else ""
        notes.append(f"set there: {', '.join(needed)}{instead}")
    settings = "".join(f"{name}=... " for name in needed)
    return (f"start workers on each machine ({'; '.join(notes)}):\n"
            f"  {settings}PREFECT_API_URL={_api_url()} prefect worker start --pool {pool}")


def _local_note(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return "a SQLite store: only on this machine"
    if parsed.host in (None, "", "localhost", "127.0.0.1", "::1"):
        return f"the store's host is {parsed.host or 'a local socket'}: only this machine reaches it"
    return ""


def _api_url() -> str:
    from prefect.settings import get_current_settings

    return str(get_current_settings().api.url)
