"""Database URL resolution, engines and migrations.

Default: a SQLite file `agentbatch.sqlite` in the working directory (or `AGENTBATCH_DB_PATH`).
`AGENTBATCH_DB_URL` (e.g. `postgresql+psycopg://user@host/db`) overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
DEFAULT_SQLITE_NAME = "agentbatch.sqlite"


def resolve_url(url: str | None = None) -> str:
    if url:
        return url
    if env_url := os.environ.get("AGENTBATCH_DB_URL"):
        return env_url
    path = os.environ.get("AGENTBATCH_DB_PATH", DEFAULT_SQLITE_NAME)
    return f"sqlite:///{Path(path).resolve()}"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            # WAL lets readers (status, report) run beside the writing batch; foreign keys for cascades.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision of every branch (`heads`)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "heads")
