"""The `agentbatch` command line.

Each subcommand lives in its own module under `agentbatch/flows/commands/` and exposes
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it. Modules are found
automatically, so adding a command means adding a file; a run imports only its command's module
(`command_module`), so one command's imports are not paid for by the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from agentbatch.flows import commands
from agentbatch.flows.commands._common import fail

# Commands registered by a module not named after them; every other command `x-y` lives in `x_y.py`.
COMMAND_MODULES = {"create": "run"}
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # also what tests capture in-process


def command_module(argv: list[str]) -> str | None:
    """The module of the command `argv` names (its first word that is not an option), if there is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None:
        return None
    name = COMMAND_MODULES.get(word, word.replace("-", "_"))
    known = {m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")}
    return name if name in known else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the one in module `only` (a command's run imports just its
    own module: the others' imports are not paid for)."""
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
        if info.name.startswith("_") or (only is not None and info.name != only):  # private helpers
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_module(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=LOG_FORMAT,
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
