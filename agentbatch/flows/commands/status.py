"""`agentbatch status BATCH_ID [--db URL]`: progress, counts per state and a live ETA."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from agentbatch.flows.commands._common import EXIT_USAGE, add_db_option, fail, quiet_on_closed_pipe

if TYPE_CHECKING:
    from agentbatch.db.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status",
        help="progress of a batch and a live ETA",
        description="Samples done / total, counts per state, steps done, and the remaining time estimated "
        "from the chain lengths seen so far (and from earlier batches of the same task ids).",
    )
    p.add_argument("batch_id", type=int, help="batch id")
    p.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                   help="print again every SECONDS until the batch is done (Ctrl-C stops)")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(run))


def open_store_or_explain(url: str | None, command: str) -> Store | None:
    """The store opened read-only (nothing is ever created), or None after saying why not."""
    from agentbatch.db.engine import StoreUnavailable
    from agentbatch.db.store import Store

    try:
        return Store(url, read_only=True)
    except StoreUnavailable as exc:
        fail(f"{command}: {exc}; `agentbatch run` prints the --db of the store it wrote to")
        return None


def run(args: argparse.Namespace) -> int:
    # Aggregates only, and no pandas: a batch of 10,000 samples answers in well under a second.
    from agentbatch.dashboards.checks import stopped_in_flight
    from agentbatch.dashboards.eta import estimate_eta
    from agentbatch.dashboards.groups import group_line, tallied_group_scores
    from agentbatch.db.store import UnknownBatch
    from agentbatch.flows.crash_watch import mark_prefect_crashed
    from agentbatch.flows.stored_plugins import plugins_line
    from agentbatch.protocols.environment import IN_FLIGHT_STOPPED

    store = open_store_or_explain(args.db, "status")
    if store is None:
        return EXIT_USAGE
    try:
        try:
            eta = estimate_eta(store, args.batch_id)
        except UnknownBatch as exc:
            return fail(f"status: {exc}")
        if eta.status == "crashed":
            batch = store.get_batch(args.batch_id)
            note = mark_prefect_crashed(batch.flow_run_id if batch else None, eta.notes[-1])
            eta.notes.extend([note] if note else [])
        print(eta.to_text(), flush=True)
        for stopped in stopped_in_flight(store.samples_with_error_prefix(args.batch_id, IN_FLIGHT_STOPPED)):
            print(f"  CHECK sample {stopped['sample']}: {stopped['check']}", flush=True)
        if by_group := group_line(tallied_group_scores(store.group_tallies(args.batch_id)), "  score by group "):
            print(by_group, flush=True)
        batch = store.get_batch(args.batch_id)
        print(plugins_line(batch.config if batch else {}, import_targets=False), flush=True)
        while args.watch and eta.done < eta.total and eta.status != "crashed":
            time.sleep(args.watch)
            eta = estimate_eta(store, args.batch_id)
            print(eta.to_text(), flush=True)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
