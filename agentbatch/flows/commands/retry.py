"""`agentbatch retry BATCH_ID`: run the failed samples of a batch again, and only those."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentbatch.flows.commands._common import add_db_option, fail, quiet_prefect_defaults
from agentbatch.flows.commands._inputs import stored_config_error, writer_inputs_error
from agentbatch.flows.commands._outcome import (
    add_fail_on_error,
    batch_problem,
    busy_now,
    check_fail_on_error,
    finish_command,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "retry", help="run the failed samples of a batch again",
        description="A new attempt of the failed samples of BATCH_ID (e.g. after the engine server that "
        "died is back). Each continues from its last completed step: no completed step runs again, "
        "every earlier attempt stays in the store, and the summary covers the whole batch (its "
        "completed samples and the retried ones). Exits 2 while another process drives the batch.",
    )
    p.add_argument("batch_id", type=int)
    add_db_option(p)
    add_fail_on_error(p)
    p.add_argument("--report", type=Path, metavar="DIR", help="also write the HTML/PNG report to DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if error := check_fail_on_error(args.fail_on_error):
        return fail(error)
    if error := writer_inputs_error(args.db, args.report, must_exist=True):
        return fail(error)
    quiet_prefect_defaults()
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import resume_batch

    store = Store(args.db)
    row = store.get_batch(args.batch_id)
    error = None if row is None else stored_config_error(row.config, args.batch_id)
    if error := error or batch_problem(store, args.batch_id):  # unknown id; a secret reference not set
        store.close()
        return fail(error)
    if message := busy_now(store, args.batch_id):
        return fail(message)
    n = store.reset_failed(args.batch_id)
    print(f"batch {args.batch_id}: retrying {n} failed sample(s)", flush=True)
    outcome = resume_batch(store, args.batch_id, show_progress=False if args.no_progress else None,
                           report_dir=args.report, fail_on_error=args.fail_on_error)
    return finish_command(store, outcome, args.fail_on_error)
