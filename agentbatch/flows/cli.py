"""The `agentbatch` command line.

Each subcommand lives in its own module under `agentbatch/flows/commands/` and exposes
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it. Modules are found
automatically, so adding a command means adding a file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from agentbatch.flows import commands
from agentbatch.flows.commands._common import fail


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentbatch",
        description="Run big batches of LLM-agent samples (evals, synthetic data, RL rollouts) with "
        "inference-environment coordination, persisted in a SQL store, orchestrated by Prefect.",
        epilog="Store: SQLite file ./agentbatch.sqlite by default; set AGENTBATCH_DB_URL "
        "(e.g. postgresql+psycopg://user@host/db) or AGENTBATCH_DB_PATH to change it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # private helpers of the commands
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # per-request chatter of libraries
        for name in ("httpx", "alembic", "docker", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from agentbatch.db.engine import StoreUnavailable

    try:
        return int(args.func(args) or 0)
    except StoreUnavailable as exc:  # a store no command can use (unknown schema revision, ...): bad input
        return fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
