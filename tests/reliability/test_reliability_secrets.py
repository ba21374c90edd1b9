"""Finding 5: no secret stored or printed.

A batch against a real HTTP engine (the simulated server) whose endpoint has an API key and a URL
with a password runs to its end; the planted secrets appear nowhere: not in the store's file (every
table), not in the terminal output with debug logging on, not in the report, not in the flow run's
parameters on the Prefect server. The store keeps environment references instead; a `resume` in a
process without them names the variable to set, and one given in the config as `${VAR}` stays one.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config, cli_env, run_cli, write_config
from sqlalchemy.engine import make_url
from testkit import CLI

from agentbatch.db.store import Store
from agentbatch.engines.sim_server import running_sim_server

pytestmark = [pytest.mark.slow]
KEY = "sk-PLANTED-9f3a7c21e4"
URL_PASSWORD = "pw-PLANTED-55d0b2"
ENV_KEY = "envkey-PLANTED-0c4e"


def store_text(path: Path) -> str:
    """Every row of every table, as text (plus the raw bytes of the files, decoded loosely)."""
    con = sqlite3.connect(path)
    dump = "\n".join(con.iterdump())
    con.close()
    raw = "".join(p.read_bytes().decode("latin-1") for p in path.parent.glob(path.name + "*"))
    return dump + raw


def flow_run_parameters(api_url: str) -> str:
    import httpx

    # The newest runs first: the server is shared by the whole test run, this test's run is among them.
    runs = httpx.post(f"{api_url}/flow_runs/filter", json={"limit": 200, "sort": "EXPECTED_START_TIME_DESC"},
                      timeout=30).json()
    return "\n".join(str(r.get("parameters")) for r in runs)


def test_planted_secrets_are_nowhere(tmp_path: Path, prefect_api: str) -> None:
    db = tmp_path / "s.sqlite"
    url = f"sqlite:///{db}"
    with running_sim_server("tiny-cpu", worker_name="sim-s") as base:
        host = base.removeprefix("http://")
        cfg = bfcl_config("secrets", limit=2)
        cfg["engine"] = {"kind": "openai", "params": {"endpoints": [
            {"name": "sim-s", "base_url": f"http://agent:{URL_PASSWORD}@{host}", "model": "tiny-cpu", "api_key": KEY},
        ]}}
        done = run_cli(["-v", "run", str(write_config(tmp_path, cfg)), "--no-progress", "--report",
                        str(tmp_path / "report")], url)
        assert done.returncode in (0, 1), done.stdout + done.stderr  # the model's text fails the checker
        store = Store(url)
        batch = store.list_batches()[0]
        assert all(s.status == "completed" for s in store.samples(batch.id))  # the key and URL worked
        endpoint = batch.config["engine"]["params"]["endpoints"][0]
        assert endpoint["api_key"] == "${AGENTBATCH_SECRET_ENGINE_PARAMS_ENDPOINTS_0_API_KEY}"
        assert "${AGENTBATCH_SECRET_" in endpoint["base_url"]
        store.close()

        places = {
            "store": store_text(db),
            "terminal": done.stdout + done.stderr,
            "report": "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "report").rglob("*")
                              if p.is_file()),
            "prefect parameters": flow_run_parameters(prefect_api),
        }
        assert "HTTP Request" in places["terminal"] or "batch" in places["terminal"]
        for where, text in places.items():
            for secret in (KEY, URL_PASSWORD):
                assert secret not in text, f"{secret} found in the {where}"

        # another process without the references: told which variable to set, nothing run
        again = run_cli(["resume", str(batch.id), "--no-progress"], url)
        assert again.returncode == 2, again.stdout + again.stderr
        assert "AGENTBATCH_SECRET_ENGINE_PARAMS_ENDPOINTS_0_API_KEY" in again.stderr
        assert KEY not in again.stdout + again.stderr


def test_env_reference_stays_a_reference(tmp_path: Path, prefect_api: str) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with running_sim_server("tiny-cpu", worker_name="sim-r") as base:
        cfg = bfcl_config("secret-ref", limit=1)
        cfg["engine"] = {"kind": "openai", "params": {"endpoints": [
            {"name": "sim-r", "base_url": base, "model": "tiny-cpu", "api_key": "${PLANTED_API_KEY}"}]}}
        env = cli_env(url, PLANTED_API_KEY=ENV_KEY)
        done = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "-v", "run",
                               str(write_config(tmp_path, cfg)), "--no-progress"], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        assert ENV_KEY not in done.stdout + done.stderr
        store = Store(url)
        batch = store.list_batches()[0]
        assert batch.config["engine"]["params"]["endpoints"][0]["api_key"] == "${PLANTED_API_KEY}"
        assert all(s.status == "completed" for s in store.samples(batch.id))
        store.close()
    assert ENV_KEY not in store_text(tmp_path / "r.sqlite")


PG_SECRET_URL = os.environ.get("AGENTBATCH_TEST_PG_SECRET_URL")  # .ci/run: a role with a unique password


def pg_text(url: str) -> str:
    """Every row of every table of the store's PostgreSQL database, as text."""
    from sqlalchemy import MetaData, create_engine

    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        rows = [str(row) for table in meta.sorted_tables for row in conn.execute(table.select())]
    engine.dispose()
    return "\n".join(rows)


def fresh_pg_store(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:  # the role owns its database: start from an empty schema
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.skipif(not PG_SECRET_URL, reason="AGENTBATCH_TEST_PG_SECRET_URL not set (.ci/run sets it)")
def test_a_postgresql_store_password_is_nowhere(tmp_path: Path, prefect_api: str) -> None:
    """`run --db` with a PostgreSQL URL holding a password (one no other string contains): the batch
    runs on that store, and the password is not in the terminal output (debug logging on), nor in any
    row of the store, nor in the report, nor in the flow run's parameters on the Prefect server."""
    assert PG_SECRET_URL is not None
    password = make_url(PG_SECRET_URL).password
    assert password and len(password) > 12
    fresh_pg_store(PG_SECRET_URL)
    done = subprocess.run([*CLI, "-v", "run", str(write_config(tmp_path, bfcl_config("pg-secret", limit=2))),
                           "--no-progress", "--db", PG_SECRET_URL, "--report", str(tmp_path / "report")],
                          env={k: v for k, v in os.environ.items() if k != "AGENTBATCH_DB_URL"}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    store = Store(PG_SECRET_URL)
    batches = store.list_batches()
    assert [b.name for b in batches] == ["pg-secret"] and len(store.samples(batches[0].id)) == 2
    store.close()
    places = {
        "terminal": done.stdout + done.stderr,
        "store": pg_text(PG_SECRET_URL),
        "report": "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "report").rglob("*") if p.is_file()),
        "prefect parameters": flow_run_parameters(prefect_api),
    }
    assert "pg-secret" in places["store"] and "postgresql" in places["terminal"]
    for where, text in places.items():
        assert password not in text, f"the store's password found in the {where}"
