"""`agentbatch retry BATCH_ID`: run the failed samples of a batch again, and only those
(the same as `agentbatch resume BATCH_ID --retry-failed`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentbatch.flows.commands import resume
from agentbatch.flows.commands._common import add_db_option
from agentbatch.flows.commands._launch import add_progress_options
from agentbatch.flows.commands._outcome import add_fail_on_error


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
    resume.add_in_flight_checked(p)
    add_fail_on_error(p)
    p.add_argument("--report", type=Path, metavar="DIR", help="also write the HTML/PNG report to DIR")
    add_progress_options(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    args.retry_failed = True
    return resume.main(args)
