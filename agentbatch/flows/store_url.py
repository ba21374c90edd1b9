"""The store URL at the edges of a run: checked before anything is written, shown without its
password, and passed to a flow run (whose parameters the Prefect server keeps in plain text) with its
password as an environment reference that the process running the flow resolves."""

from __future__ import annotations

import os
from pathlib import Path

from agentbatch.protocols.secrets import MissingSecret, from_stored, redact_text, to_stored

SUPPORTED_DIALECTS = ("sqlite", "postgresql")
URL_HINT = "expected sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
DB_PASSWORD_VARIABLE = "AGENTBATCH_SECRET_DB_URL_PASSWORD"  # what to_stored names the db_url's password


def shown_url(url: str) -> str:
    """The URL as it may be printed: the password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return redact_text(make_url(url).render_as_string(hide_password=True))  # and `?password=`
    except (ArgumentError, ValueError):
        return "<unparsable URL>"


def db_url_error(url: str, arg: str = "--db") -> str | None:
    """Syntax and dialect of a store URL, and for SQLite that the file's folder exists."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        return f"{arg}: not a database URL ({exc.__class__.__name__}); {URL_HINT}"
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_DIALECTS:
        return f"{arg}: unsupported database {backend!r} in {shown_url(url)}; {URL_HINT}"
    try:
        parsed.get_dialect()
    except (NoSuchModuleError, ImportError) as exc:
        return f"{arg}: no driver for {parsed.drivername!r} ({exc}); {URL_HINT}"
    if backend == "sqlite" and parsed.database and parsed.database != ":memory:":
        path = Path(parsed.database)
        if path.exists() and not path.is_file():
            return f"{arg}: {path} is not a file"
        if not path.parent.is_dir():
            return f"{arg}: folder {path.parent} does not exist"
    return None


def flow_param_url(url: str) -> str:
    """The store URL as a flow-run parameter: a password becomes `${AGENTBATCH_SECRET_DB_URL_PASSWORD}`
    (this process keeps the value in its environment, so a flow run here still resolves it)."""
    return str(to_stored({"db_url": url})["db_url"])


def _same_database(a: str, b: str) -> bool:
    from sqlalchemy.engine import make_url

    ua, ub = make_url(a), make_url(b)
    return (ua.get_backend_name(), ua.username, ua.host, ua.port, ua.database) == \
        (ub.get_backend_name(), ub.username, ub.host, ub.port, ub.database)


def url_from_param(param: str) -> str:
    """The store URL a flow run opens: the parameter with its password reference resolved from this
    process's environment; failing that, AGENTBATCH_DB_URL when it names the same database."""
    try:
        return str(from_stored({"db_url": param})["db_url"])
    except MissingSecret:
        env_url = os.environ.get("AGENTBATCH_DB_URL", "")
        if env_url and _same_database(env_url, param):
            return env_url
        raise MissingSecret(f"the store URL {param} keeps its password in the environment: set "
                            f"{DB_PASSWORD_VARIABLE} (or AGENTBATCH_DB_URL to the full URL) where this flow "
                            "runs") from None
