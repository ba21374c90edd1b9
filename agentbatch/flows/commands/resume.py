"""`agentbatch resume BATCH_ID`: continue an interrupted batch from the store."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentbatch.flows.commands._common import add_db_option, fail, print_outcome, quiet_prefect_defaults


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "resume", help="continue an interrupted batch",
        description="Run the samples of BATCH_ID that have not finished. Completed steps are taken from the "
        "store and not executed again; a step that was running when the process died is retried.",
    )
    p.add_argument("batch_id", type=int)
    add_db_option(p)
    p.add_argument("--report", type=Path, metavar="DIR", help="also write the HTML/PNG report to DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    quiet_prefect_defaults()
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import resume_batch

    store = Store(args.db)
    if store.get_batch(args.batch_id) is None:
        return fail(f"no batch {args.batch_id} in {store.url}")
    outcome = resume_batch(store, args.batch_id, show_progress=False if args.no_progress else None,
                           report_dir=args.report)
    return print_outcome(store, outcome)
