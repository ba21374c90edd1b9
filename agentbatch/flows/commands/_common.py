"""Helpers shared by the subcommands: the --db option, error exits, a quiet end on a closed pipe."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

from agentbatch.flows.commands._inputs import db_url_arg

EXIT_USAGE = 2  # bad input: config file, batch id, arguments
DEFAULT_PROFILE = "llama3-8b-h100"  # the simulated engine's profile where a command is given none


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", metavar="URL", default=None, type=db_url_arg,
        help="store URL (default: $AGENTBATCH_DB_URL, else sqlite file $AGENTBATCH_DB_PATH or ./agentbatch.sqlite)",
    )


EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a command killed by a closed pipe returns


def quiet_on_closed_pipe(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A read-only command whose reader went away (`agentbatch status 3 | head`) stops quietly: no
    BrokenPipeError traceback, neither now nor when Python flushes stdout at exit."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            code = func(args)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the exit-time flush writes nowhere instead of failing
            return EXIT_CLOSED_PIPE

    return run


def fail(message: str, code: int = EXIT_USAGE) -> int:
    from agentbatch.protocols.secrets import redact_text  # a URL password or known key in a message: ***

    print(f"agentbatch: error: {redact_text(message)}", file=sys.stderr)
    return code
