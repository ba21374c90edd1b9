"""`agentbatch status BATCH_ID [--db URL]`: progress, counts per state and a live ETA."""

from __future__ import annotations

import argparse
import sys
import time


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
    p.add_argument("--db", default=None, help="store URL (default: AGENTBATCH_DB_URL or ./agentbatch.sqlite)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentbatch.dashboards.eta import estimate_eta
    from agentbatch.dashboards.frames import UnknownBatch
    from agentbatch.db.store import Store

    store = Store(args.db)
    try:
        try:
            eta = estimate_eta(store, args.batch_id)
        except UnknownBatch as exc:
            print(f"agentbatch status: {exc}", file=sys.stderr)
            return 2
        print(eta.to_text(), flush=True)
        while args.watch and eta.done < eta.total:
            time.sleep(args.watch)
            eta = estimate_eta(store, args.batch_id)
            print(eta.to_text(), flush=True)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
