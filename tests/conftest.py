"""Shared fixtures: a migrated store on SQLite (a temp file) and on PostgreSQL.

PostgreSQL comes from AGENTBATCH_TEST_PG_URL (`.ci/run` starts a local cluster and sets it); the role
needs CREATEDB. Each test gets a database of its own, created empty and dropped afterwards, so
parallel test runs do not disturb each other.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from agentbatch.db.store import Store

PG_URL = os.environ.get("AGENTBATCH_TEST_PG_URL", "")

# Lean Prefect settings for the flows the tests run (the CLI sets the same defaults).
for _key, _value in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_TO_API_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
}.items():
    os.environ.setdefault(_key, _value)


def _pg_unavailable_reason() -> str | None:
    if not PG_URL:
        return "AGENTBATCH_TEST_PG_URL is not set (.ci/run starts PostgreSQL and sets it)"
    try:
        engine = create_engine(PG_URL)
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - any connection failure means: skip
        return f"PostgreSQL at AGENTBATCH_TEST_PG_URL is unreachable: {exc.__class__.__name__}: {exc}"
    return None


def _admin(sql: str) -> None:
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'agentbatch.sqlite'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    reason = _pg_unavailable_reason()
    if reason:
        pytest.skip(reason)
    name = f"agentbatch_t_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_URL.rpartition("/")
    yield f"{base}/{name}"
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A fresh database URL, once for SQLite and once for PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentbatch.sqlite'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()
