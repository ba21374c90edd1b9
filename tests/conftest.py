"""Shared fixtures: a migrated store on SQLite (a temp file) and on PostgreSQL.

PostgreSQL comes from AGENTBATCH_TEST_PG_URL (`.ci/run` starts a local cluster and sets it); the role
needs CREATEDB. Each test gets a database of its own, created empty and dropped afterwards, so
parallel test runs do not disturb each other.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from agentbatch.db.store import Store

PG_URL = os.environ.get("AGENTBATCH_TEST_PG_URL", "")

# Lean Prefect settings for the flows the tests run (the CLI sets the same defaults).
for _key, _value in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_TO_API_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # No background Prefect server left behind by `agentbatch run` in tests (flows/prefect_server.py);
    # tests that need a server use the prefect_api fixture, tests of the local server opt in.
    "AGENTBATCH_PREFECT_SERVER": "ephemeral",
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
    if reason and PG_URL:  # asked for and down: a failure, never a silent skip
        pytest.fail(reason, pytrace=False)
    if reason:
        pytest.skip(reason)
    name = f"agentbatch_t_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_URL.rpartition("/")
    yield f"{base}/{name}"
    _drop_database(name)


def _drop_database(name: str, tries: int = 20) -> None:
    """DROP ... WITH (FORCE) as the test role cannot end an autovacuum worker (a superuser's process)
    that happens to be on the database: wait for it to finish and try again."""
    for attempt in range(tries):
        try:
            _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "42501" or attempt == tries - 1:  # insufficient_privilege
                raise
            time.sleep(0.5)


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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """A real Prefect server for the session (unless PREFECT_API_URL points at one already).

    One server for every flow the tests run, in-process or in subprocesses (they inherit the
    environment), instead of a temporary server per process: those are slow to start on a loaded
    2-core machine and lose most task-run records when their process ends.
    """
    import subprocess
    import sys
    import time

    import httpx

    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    port = _free_port()
    home = tmp_path_factory.mktemp("prefect-home")
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"Prefect server did not start; see {home / 'server.log'}")
        time.sleep(0.5)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    old = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ["PREFECT_API_URL"] = url  # for subprocesses
    os.environ["PREFECT_HOME"] = str(home)
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):  # for this process (settings are cached)
            yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# --- CI=true: a skipped test is a failure (a service it needs did not start) ----------------------------
def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _fail_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which runs every test: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())
