"""Shared fixtures: a migrated store on SQLite (a temp file) and on PostgreSQL, one Prefect server for
the whole run (all xdist workers), and the CI=true rule (a skipped test fails the run).

PostgreSQL comes from AGENTBATCH_TEST_PG_URL (`.ci/run` starts a local cluster and sets it); the role
needs CREATEDB. Each test gets a database of its own, created empty and dropped afterwards, so
parallel test runs (`make test` runs pytest-xdist workers) do not disturb each other. Helpers that
several test folders use are in testkit.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from testkit import answers, free_port, wait_until

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


# --- one Prefect server per xdist worker (or for a plain run) -------------------------------------------
# Started by a worker when its first test needs it, reused by its later tests; the controller process
# (the one without `workerinput`, also a plain non-xdist run) stops them all at the end. One server per
# worker, not one for all: a single SQLite-backed server under four workers' flows answered 503
# (database locked) to some requests.
_SHARED_DIR_ENV = "AGENTBATCH_TEST_SHARED_DIR"
_OWNS_SHARED_DIR = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and not os.environ.get(_SHARED_DIR_ENV):
        # Set before xdist starts its workers: they inherit it.
        os.environ[_SHARED_DIR_ENV] = tempfile.mkdtemp(prefix="agentbatch-tests-")
        config.stash[_OWNS_SHARED_DIR] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_OWNS_SHARED_DIR, False):
        shared = Path(os.environ.pop(_SHARED_DIR_ENV))
        _stop_shared_server(shared)
        shutil.rmtree(shared, ignore_errors=True)


def _start_server(home: Path) -> dict[str, object]:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(home / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_until(lambda: answers(f"{url}/health"), 180, f"Prefect server at {url} (log: {home / 'server.log'})",
                   interval_s=0.2, alive=lambda: proc.poll() is None)
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return {"url": url, "pid": proc.pid}


def _shared_server(shared: Path) -> str:
    """The run's one Prefect server: the first worker to need it starts it (under a file lock, so
    exactly one does), the others wait on the lock and reuse it."""
    info_file, home = shared / "prefect-server.json", shared / "prefect-server-home"
    with open(shared / "prefect-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not info_file.exists():
            home.mkdir(exist_ok=True)
            info_file.write_text(json.dumps(_start_server(home)))
    url = str(json.loads(info_file.read_text())["url"])
    if not answers(f"{url}/health"):
        raise RuntimeError(f"the tests' Prefect server at {url} is down; see {home / 'server.log'}")
    return url


def _stop_shared_server(shared: Path) -> None:
    info_file = shared / "prefect-server.json"
    if info_file.exists():
        _stop_server(json.loads(info_file.read_text())["pid"])


def _stop_server(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
        # Not our child when a worker started it: poll until its process group is gone.
        wait_until(lambda: not _group_alive(pid), 20, "Prefect server exit", interval_s=0.1)
    except ProcessLookupError:
        return
    except AssertionError:
        os.killpg(pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):  # reap it when it is our own child
        os.waitpid(pgid, os.WNOHANG)
    return True


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The run's real Prefect server (unless PREFECT_API_URL points at one already).

    One server for every flow that every worker's tests run, in-process or in subprocesses (they
    inherit the environment), instead of a temporary server per process (slow to start on a loaded
    2-core machine, and it loses most task-run records when its process ends) or one per worker (each
    costs CPU to start and to idle). Tests name what they create on it (deployments, work pools, tags)
    uniquely and read back only their own flow runs' records.
    """
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    shared = Path(os.environ[_SHARED_DIR_ENV])
    url = _shared_server(shared)
    home = shared / f"prefect-home-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"  # this worker's client files
    home.mkdir(exist_ok=True)
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


# --- the longest tests first: the parallel run's end is not held up by a long test started last ---------
# Whole modules move (module fixtures stay set up once): the vLLM modules (each starts workers: the
# longest), then the modules with slow tests, then the rest, each in collection order. Every xdist
# worker collects the same order, as xdist requires.
def _module_rank(item: pytest.Item) -> int:
    if item.get_closest_marker("vllm"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        rank[module] = min(rank.get(module, 2), _module_rank(item))
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
