"""The end of `run`, `resume` and `retry`: the summary, the busy message, the exit status."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from agentbatch.flows.commands._common import EXIT_USAGE

if TYPE_CHECKING:
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import BatchOutcome


def add_fail_on_error(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on-error", metavar="N|FRACTION", default=None,
        help="stop the batch (status failed, exit 1) once more than N samples failed, or more than "
        "FRACTION (0 < FRACTION < 1) of them; failures within the limit exit 0 with status "
        "completed_with_failures (default: no limit; any failed sample exits 1)",
    )


def check_fail_on_error(text: str | None) -> str | None:
    """The --fail-on-error error message, or None when it is valid."""
    from agentbatch.flows.leased import FailurePolicy

    try:
        FailurePolicy.parse(text)
    except ValueError as exc:
        return str(exc)
    return None


def batch_problem(store: Store, batch_id: int) -> str | None:
    """Why BATCH_ID cannot run from this store (unknown id, a secret reference not set), or None."""
    from agentbatch.protocols.secrets import MissingSecret, from_stored, redact_text

    batch = store.get_batch(batch_id)
    if batch is None:
        return f"no batch {batch_id} in {redact_text(store.url)}"
    try:
        from_stored(batch.config)
    except MissingSecret as exc:
        return f"batch {batch_id}: config {exc}"
    return None


def busy_now(store: Store, batch_id: int) -> str | None:
    """The message for a batch whose every unfinished sample another live process drives."""
    from agentbatch.db.leases import SampleLeases
    from agentbatch.flows.leased import busy_message

    leases = SampleLeases(store, batch_id)
    if leases.claimable_count() or not (foreign := leases.foreign()):
        return None
    return busy_message(batch_id, foreign)


def finish_command(store: Store, outcome: BatchOutcome, fail_on_error: str | None) -> int:
    """Print the summary (or why nothing ran) and return the exit status."""
    from agentbatch.dashboards.summary import summarize
    from agentbatch.flows.leased import BUSY, FailurePolicy, exit_code

    if outcome.status == BUSY:
        print(f"agentbatch: error: {busy_now(store, outcome.batch_id) or 'another process drives this batch'}",
              file=sys.stderr)
        return EXIT_USAGE
    print(summarize(store, outcome.batch_id).to_text())
    print(f"batch status: {outcome.status}")
    from agentbatch.db.leases import count_may_have_executed

    if maybe := count_may_have_executed(store, outcome.batch_id):
        print(f"may have executed: {maybe} step(s) of environments with external state were cut short by a dead "
              "process (their side effects may exist; the steps are flagged in the store)")
    if outcome.report_path:
        print(f"report: {outcome.report_path}")
    return exit_code(outcome.status, outcome.failed, FailurePolicy.parse(fail_on_error))
