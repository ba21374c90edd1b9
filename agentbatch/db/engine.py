"""Database URL resolution, engines and migrations.

Default: a SQLite file `agentbatch.sqlite` in the working directory (or `AGENTBATCH_DB_PATH`).
`AGENTBATCH_DB_URL` (e.g. `postgresql+psycopg://user@host/db`) overrides it.

Migrations are safe when several processes open a fresh store at once: on PostgreSQL they run under
a transaction-scoped advisory lock, on SQLite inside `BEGIN IMMEDIATE` (the write lock is taken
before the schema is read), so the second process finds the schema done. On SQLite, foreign keys are
off during a migration (a rebuilt table is dropped and recreated: with them on, dropping `batches`
deleted every sample and step) and checked before the commit; a store that has a schema is first
copied to `<file>.<revision>.bak`, named in a warning. Read-only opens
(`read_only=True`: status, report) never create a file or a table and never migrate.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import SQLAlchemyError

from agentbatch.db.revisions import (
    StampError,
    alembic_config,
    backup_sqlite,
    chain_revision,
    head,
    restamp,
    stamp_of,
)

if TYPE_CHECKING:  # Alembic is imported only when a store must be migrated
    from alembic.config import Config

log = logging.getLogger("agentbatch.db")
DEFAULT_SQLITE_NAME = "agentbatch.sqlite"
MIGRATION_LOCK_KEY = 0x61676E74626174  # any constant shared by every agentbatch process ("agntbat")
SQLITE_BUSY_TIMEOUT_S = 30.0


class StoreUnavailable(Exception):
    """A store that a read-only command cannot open: missing file, no agentbatch schema, old schema."""


def resolve_url(url: str | None = None) -> str:
    if url:
        return url
    if env_url := os.environ.get("AGENTBATCH_DB_URL"):
        return env_url
    path = os.environ.get("AGENTBATCH_DB_PATH", DEFAULT_SQLITE_NAME)
    return f"sqlite:///{Path(path).resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for in-memory databases and other dialects)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if read_only and path is not None:
            if not path.is_file():
                raise StoreUnavailable(f"no store at {path} (a read-only command does not create one)")
            # mode=ro: SQLite itself refuses to write anything through this engine. A store no process
            # has open (no -wal file) is read as immutable: no -wal or -shm is created next to it, its
            # files stay byte-identical; `_refuse_changed_reads` catches a writer that starts meanwhile.
            quiet = not Path(f"{path}-wal").exists()
            flags = "mode=ro&immutable=1" if quiet else "mode=ro"
            engine = create_engine(f"sqlite:///file:{path.resolve()}?{flags}&uri=true",
                                   connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
            if quiet:
                _refuse_changed_reads(engine, path)
        else:
            engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:  # sqlite3.Connection, its pool record
            cur = dbapi_conn.cursor()
            if not read_only:
                _enable_wal(cur)
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")  # for cascades
            cur.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True)
    if read_only:

        @event.listens_for(engine, "begin")
        def _read_only(conn: Connection) -> None:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")

    return engine


def _enable_wal(cur: sqlite3.Cursor, timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
    """WAL lets readers (status, report) run beside the writing batch. Switching a file to WAL needs it
    to itself, and SQLite answers "database is locked" at once, without its busy timeout, while another
    process opens or migrates the same fresh file: so wait here. A file already in WAL takes no lock."""
    if cur.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        return
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _refuse_changed_reads(engine: Engine, path: Path) -> None:
    """An immutable read takes no lock: if the file changed under it (a writer started and checkpointed),
    what was read may mix old and new pages. Checked as each transaction ends, before its rows are used."""

    def state() -> tuple[int, int, int]:
        st = path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    before = state()

    def _check(_conn: Connection) -> None:
        if state() != before:
            raise StoreUnavailable(f"the store {path} changed while it was read (a process writes to it "
                                   "now); run the command again")

    event.listen(engine, "commit", _check)
    event.listen(engine, "rollback", _check)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision, once, whoever else is opening the same store at the
    same moment, keeping every row (SQLite: foreign keys off while tables are rebuilt, a backup first)."""
    with engine.connect() as conn:
        if stamp_of(conn) == {head()}:
            return  # the common case: nothing to do, no lock taken
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.connect() as conn:
        on_sqlite = conn.dialect.name == "sqlite"
        if on_sqlite:
            # Batch mode rebuilds a table by dropping it: with enforcement on, dropping `batches` cascades to
            # every sample and step. The pragma is a no-op inside a transaction, so it comes first.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock first: no stale schema read
        else:
            conn.begin()
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        try:
            _upgrade(conn, cfg)
            conn.commit()
        except BaseException:
            conn.invalidate()  # rolled back; the connection (enforcement off) is not pooled again
            raise
        if on_sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")


def _upgrade(conn: Connection, cfg: Config) -> None:
    """Inside the migration lock: restamp an old stamp, back up a SQLite store, migrate, check references."""
    stamp = stamp_of(conn)
    try:
        current = chain_revision(stamp)
    except StampError as exc:
        raise StoreUnavailable(str(exc)) from exc
    if current is not None and stamp != {current}:
        restamp(conn, current)  # ids from before the chain was numbered
    if current == head():
        return
    path = sqlite_path(conn.engine.url.render_as_string(hide_password=False))
    backup = backup_sqlite(path, current) if path is not None and current is not None else None
    cfg.attributes["connection"] = conn
    from alembic import command

    command.upgrade(cfg, "head")
    if conn.dialect.name == "sqlite" and (broken := conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
        raise RuntimeError(f"migrating the store left rows pointing at missing rows {broken[:5]}; nothing was changed")
    if backup is not None:
        log.warning("store %s upgraded from schema %s to %s; the file as it was before: %s",
                    path, current, head(), backup)


def check_readable(engine: Engine) -> None:
    """Raise StoreUnavailable unless the store exists with the newest schema (read-only commands)."""
    try:
        with engine.connect() as conn:
            current = stamp_of(conn)
    except SQLAlchemyError as exc:
        raise StoreUnavailable(f"cannot open the store: {exc.__class__.__name__}: {getattr(exc, 'orig', None) or exc}") from exc
    if not current:
        raise StoreUnavailable("the database holds no agentbatch store (no schema)")
    try:
        revision = chain_revision(current)
    except StampError as exc:
        raise StoreUnavailable(str(exc)) from exc
    if revision != head():
        raise StoreUnavailable(
            f"the store's schema {revision} is older than this agentbatch ({head()}); "
            "run a writing command (run, resume) once to migrate it"
        )
