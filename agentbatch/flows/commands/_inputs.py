"""Checks of command-line inputs made before anything is written: the store URL (`--db`,
`AGENTBATCH_DB_URL`) and output folders. Each returns a message naming the argument, or None."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentbatch.flows.store_url import db_url_error, shown_url


def db_url_arg(value: str) -> str:
    """argparse `type` of --db: a malformed or unsupported URL is a usage error (exit 2)."""
    if error := db_url_error(value, arg="URL"):
        raise argparse.ArgumentTypeError(error.removeprefix("URL: "))
    return value


def db_reachable_error(url: str, arg: str = "--db") -> str | None:
    """For a command that will write: can the store be reached (without writing anything)?"""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    if error := db_url_error(url, arg):
        return error
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database or ".")
        target = path if path.exists() else path.parent
        if parsed.database not in (None, "", ":memory:") and not os.access(target, os.W_OK):
            return f"{arg}: {target} is not writable"
        return None
    engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return f"{arg}: cannot connect to {shown_url(url)}: {reason}"
    finally:
        engine.dispose()
    return None


def out_dir_error(path: Path | None, arg: str) -> str | None:
    """An output folder that exists as a folder and is writable, or can be created."""
    if path is None:
        return None
    if path.exists():
        if not path.is_dir():
            return f"{arg}: {path} exists and is not a folder"
        return None if _can_create_in(path) else f"{arg}: {path} is not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{arg}: {parent} is not a folder"
    if not _can_create_in(parent):
        return f"{arg}: cannot create {path} ({parent} is not writable)"
    return None


def _can_create_in(folder: Path) -> bool:
    """Tried, not asked: `os.access` says yes to root on a read-only or special file system (sysfs)."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".agentbatch-probe-", dir=folder))
    except OSError:
        return False
    return True


def writer_inputs_error(db: str | None, report: Path | None, *, must_exist: bool = False) -> str | None:
    """`run` / `resume`: the store reachable (for `resume` it must exist: it is never created) and the
    report folder writable, checked before any flow starts or anything is written."""
    from sqlalchemy.engine import make_url

    from agentbatch.db.engine import resolve_url, sqlite_path

    url = resolve_url(db)
    if error := out_dir_error(report, "--report") or db_reachable_error(url):
        return error
    if must_exist and make_url(url).get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if path is not None and not path.is_file():
            return f"--db: no store at {path} (resume never creates one; `agentbatch run` prints its --db)"
    return None


def stored_config_error(row_config: dict, batch_id: int) -> str | None:
    """The stored config of a batch to resume, validated as at `run` (its plugins still installed)."""
    from agentbatch.flows.config import ConfigError, validate_config

    try:
        validate_config(row_config, source=f"batch {batch_id}'s stored config")
    except ConfigError as exc:
        return str(exc)
    return None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value
