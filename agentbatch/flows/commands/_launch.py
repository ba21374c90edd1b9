"""What `run` (and `resume`) do around the flow: progress options, the Prefect server the run reports
to, and the exact follow-up commands for the store the batch went to."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentbatch.flows.prefect_server import PrefectApi


def add_progress_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-progress", action="store_true",
                       help="no progress bar: one progress line in the log every 10 s instead (the default "
                       "when stderr is not a terminal)")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="no progress display and no INFO logs: only warnings, errors and the final summary")


def progress_mode(args: argparse.Namespace) -> str | None:
    """None: a bar on a terminal, log lines otherwise (flows/progress.py)."""
    if getattr(args, "quiet", False):
        logging.getLogger("agentbatch").setLevel(logging.WARNING)
        return "off"
    return "log" if getattr(args, "no_progress", False) else None


def start_prefect(*, start_server: bool = True) -> PrefectApi:
    """Pick the Prefect API before Prefect is imported (`flows/launch.py`, as every launch does); a
    local server that has to start comes up while the config, the workload and the store are prepared
    (`ready_prefect` waits for it)."""
    from agentbatch.flows.commands._common import fail
    from agentbatch.flows.launch import LaunchError, prepare_launch

    try:
        return prepare_launch(start_server=start_server)
    except LaunchError as exc:  # a bad AGENTBATCH_PREFECT_SERVER
        raise SystemExit(fail(str(exc))) from None


def ready_prefect(api: PrefectApi, quiet: bool = False) -> str | None:
    """Wait for a server started by `start_prefect`; the error message when it did not come up."""
    from agentbatch.flows.launch import LaunchError, wait_for_prefect

    try:
        wait_for_prefect(api)
    except LaunchError as exc:
        return str(exc)
    if not quiet or api.source == "started":
        print(api.describe(), flush=True)
    return None


def shown_url(url: str) -> str:
    """The store URL as the user should type it again: absolute SQLite path, no password."""
    from agentbatch.flows.store_url import shown_url as without_password

    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and "file:" not in url:
        url = f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    return without_password(url)


def db_flag(url: str) -> str:
    """` --db URL` unless the URL is where the store goes without options (./agentbatch.sqlite)."""
    from agentbatch.db.engine import DEFAULT_SQLITE_NAME

    default = f"sqlite:///{Path(DEFAULT_SQLITE_NAME).resolve()}"
    shown = shown_url(url)
    return "" if shown == default else f" --db {shlex.quote(shown)}"


def follow_up(url: str, batch_id: int) -> str:
    """The exact commands to watch, report on and resume this batch."""
    db = db_flag(url)
    return (f"  watch:  agentbatch status {batch_id}{db}\n"
            f"  report: agentbatch report {batch_id}{db} --out reports/batch-{batch_id}\n"
            f"  resume: agentbatch resume {batch_id}{db}")
