"""`agentbatch join BATCH_ID`: one more worker process on a batch that others may be running too.

Every process that joins a batch (on this machine or on others, all pointed at the same PostgreSQL
store) takes unfinished samples in chunks under sample leases (`db/leases.py`), runs them, and takes
the next chunk, until none is left. A process that dies (SIGKILL, a lost machine) stops renewing its
leases: once they expire, or at once when the dead process was on the same host, the others take its
samples over and continue them from their last committed step. Each worker is one Prefect flow run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from agentbatch.flows.commands._common import add_db_option, fail, quiet_prefect_defaults
from agentbatch.flows.commands._inputs import shown_url, stored_config_error

DEFAULT_CHUNK = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "join", help="add a worker process to a batch (scale-out over one PostgreSQL store)",
        description="Work on BATCH_ID beside any other process that runs it: claim up to --chunk unfinished "
        "samples under a lease, run them, claim more, until every sample is finished. Start one per core or "
        "machine against the same PostgreSQL store (--db or AGENTBATCH_DB_URL). Samples of a process that "
        "died are taken over once its leases expire (at once for a dead process on this host). Exit 0 when "
        "the batch is finished, 1 when samples failed, 2 on bad input.",
    )
    p.add_argument("batch_id", type=int)
    add_db_option(p)
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"samples claimed at a time (default {DEFAULT_CHUNK}; a few times "
                        "scheduling.max_active_samples keeps the process busy)")
    p.add_argument("--poll", type=float, default=5.0,
                   help="seconds between looks for work while other processes hold every unfinished "
                        "sample (default 5.0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def _unfinished(store: Any, batch_id: int) -> int:
    counts = store.status_counts(batch_id)
    return counts.get("pending", 0) + counts.get("running", 0)


async def work(store: Any, batch_id: int, chunk: int, poll_s: float, show_progress: bool | None) -> dict[str, Any]:
    """Claim, run, repeat; wait while others hold the rest (their leases may still expire)."""
    from agentbatch.flows.batch import execute_batch
    from agentbatch.flows.leased import BUSY

    chunks = samples = 0
    while _unfinished(store, batch_id):
        outcome = await execute_batch(store, batch_id, show_progress=show_progress, claim_limit=chunk)
        if outcome.status == BUSY:
            await asyncio.sleep(poll_s)
            continue
        chunks += 1
        samples = outcome.samples
    counts = store.status_counts(batch_id)
    return {"chunks": chunks, "samples": samples, "failed": counts.get("failed", 0),
            "completed": counts.get("completed", 0)}


def _join_flow() -> Any:
    from prefect import flow

    from agentbatch.tasks.runner import CoordinatedTaskRunner

    @flow(name="agentbatch-join", task_runner=CoordinatedTaskRunner(), validate_parameters=False,
          persist_result=False, log_prints=False)
    async def join_flow(batch_id: int, db_url: str, chunk: int, poll_s: float,
                        show_progress: bool | None = None) -> dict[str, Any]:
        from agentbatch.db.store import Store

        store = Store(db_url)
        try:
            return await work(store, batch_id, chunk, poll_s, show_progress)
        finally:
            store.close()

    return join_flow


def main(args: argparse.Namespace) -> int:
    if args.chunk < 1:
        return fail(f"--chunk: expected a number of samples >= 1, got {args.chunk}")
    if not args.poll > 0:
        return fail(f"--poll: expected seconds > 0, got {args.poll}")
    quiet_prefect_defaults()
    from agentbatch.db.store import Store

    store = Store(args.db)
    row = store.get_batch(args.batch_id)
    error = f"no batch {args.batch_id} in {shown_url(store.url)}" if row is None else stored_config_error(
        row.config, args.batch_id)
    if error:
        store.close()
        return fail(error)
    started = time.perf_counter()
    result = asyncio.run(_join_flow()(args.batch_id, store.url, args.chunk, args.poll,
                                      False if args.no_progress else None))
    store.close()
    print(f"batch {args.batch_id}: finished after {time.perf_counter() - started:.1f} s here "
          f"({result['chunks']} chunk(s) run by this process); {result['completed']} completed, "
          f"{result['failed']} failed", flush=True)
    return 1 if result["failed"] else 0
