"""`agentbatch resume BATCH_ID`: continue an interrupted batch from the store."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from agentbatch.flows.commands._common import add_db_option, fail
from agentbatch.flows.commands._inputs import stored_config_error, writer_inputs_error
from agentbatch.flows.commands._launch import (
    add_progress_options,
    progress_mode,
    ready_prefect,
    start_prefect,
)
from agentbatch.flows.commands._outcome import (
    add_fail_on_error,
    batch_problem,
    busy_now,
    check_fail_on_error,
    finish_command,
)
from agentbatch.flows.store_url import shown_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "resume", help="continue an interrupted batch",
        description="Run the samples of BATCH_ID that have not finished. Completed steps are taken from the "
        "store and not executed again; a step that was running when the process died is retried (for "
        "environments whose state lives elsewhere it is flagged 'may have executed' instead). Samples "
        "another live process drives are left to it; when it drives all of them, resume exits 2. Failed "
        "samples are not run again unless --retry-failed (or `agentbatch retry`).",
    )
    p.add_argument("batch_id", type=int)
    add_db_option(p)
    p.add_argument("--retry-failed", action="store_true",
                   help="also run the failed samples again (as `agentbatch retry BATCH_ID`)")
    add_in_flight_checked(p)
    add_fail_on_error(p)
    p.add_argument("--report", type=Path, metavar="DIR", help="also write the HTML/PNG report to DIR")
    add_progress_options(p)
    p.set_defaults(func=main)


def add_in_flight_checked(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in-flight-checked", type=int, action="append", default=[], metavar="SAMPLE_ID",
                   help="with --retry-failed / retry: run this sample again although it stopped on a step that may "
                   "have executed (its error says which call to check first). Repeatable")


def main(args: argparse.Namespace) -> int:
    """Shared by `resume` and `retry` (which is `resume --retry-failed`)."""
    if error := check_fail_on_error(args.fail_on_error):
        return fail(error)
    if error := writer_inputs_error(args.db, args.report, must_exist=True):
        return fail(error)
    api = start_prefect()  # the same Prefect server choice as `run`
    mode = progress_mode(args)
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import launch_batch

    store = Store(args.db)
    row = store.get_batch(args.batch_id)
    error = f"no batch {args.batch_id} in {shown_url(store.url)}" if row is None else stored_config_error(
        row.config, args.batch_id)
    if error := error or batch_problem(store, args.batch_id):  # unknown id; a secret reference not set
        store.close()
        return fail(error)
    if message := busy_now(store, args.batch_id):  # before anything is reset
        return fail(message)
    if args.retry_failed:
        from agentbatch.protocols.environment import IN_FLIGHT_STOPPED

        n = store.reset_failed(args.batch_id, hold=IN_FLIGHT_STOPPED, release=args.in_flight_checked)
        print(f"batch {args.batch_id}: retrying {n} failed sample(s)", flush=True)
        if held := [s.id for s in store.samples(args.batch_id) if (s.error or "").startswith(IN_FLIGHT_STOPPED)]:
            print(f"batch {args.batch_id}: not retried, a step may have executed (check, then "
                  f"--in-flight-checked SAMPLE_ID): sample(s) {', '.join(map(str, held))}", flush=True)
    if error := ready_prefect(api, quiet=mode == "off"):
        return fail(error, code=1)
    outcome = asyncio.run(launch_batch(store, args.batch_id, api=api, show_progress=mode, report_dir=args.report,
                                       fail_on_error=args.fail_on_error))
    return finish_command(store, outcome, args.fail_on_error)
