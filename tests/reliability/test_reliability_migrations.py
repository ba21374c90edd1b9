"""Migrations keep data: a store of every earlier schema version, written by the agentbatch of that
version (tests/reliability/migration_fixtures/), filled with batches, samples, steps, workers,
metrics and suite runs, is upgraded on SQLite and PostgreSQL; every row and every value it held is
still there afterwards, and the schema is the one a new store gets."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, create_engine, inspect, select, text
from testkit import run_cli_here

from agentbatch.db import history, metrics_models, models  # noqa: F401  (every table in Base.metadata)
from agentbatch.db.base import Base
from agentbatch.db.engine import StoreUnavailable, make_engine, migrate
from agentbatch.db.store import Store

FIXTURES = Path(__file__).parent / "migration_fixtures"
VERSIONS = sorted(p.name.split(".")[0][1:] for p in FIXTURES.glob("v*.sqlite.sql"))
HEAD = "0008_lease_token"
DEMOTED = "duplicate completion (recorded before leases)"  # migration 0003's rule for a step completed twice


def load_fixture(url: str, version: str) -> None:
    """Fill an empty database with the committed dump of schema `version` (SQLite or PostgreSQL)."""
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.removeprefix("sqlite:///"))
        con.executescript((FIXTURES / f"v{version}.sqlite.sql").read_text())
        con.close()
        return
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.connection.dbapi_connection.execute((FIXTURES / f"v{version}.postgresql.sql").read_text())
    engine.dispose()


def snapshot(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, ordered by primary key, as plain dicts."""
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {name: [dict(r._mapping) for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
                for name, t in meta.tables.items()}


def stamps(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def expected_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps after 0003: of several completions of one step, the first stays, the rest are demoted."""
    seen: set[tuple[int, int]] = set()
    out = []
    for row in steps:  # ordered by id
        key = (row["sample_id"], row["index"])
        if row["status"] == "completed":
            if key in seen:
                row = {**row, "status": "abandoned", "error": DEMOTED}
            seen.add(key)
        out.append(row)
    return out


def schema_of(engine: Engine) -> dict[str, Any]:
    insp = inspect(engine)
    return {
        table: {
            "columns": {c["name"]: (str(c["type"]), c["nullable"]) for c in insp.get_columns(table)},
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(table)),
            "foreign_keys": sorted((tuple(f["constrained_columns"]), f["referred_table"], f["options"].get("ondelete"))
                                   for f in insp.get_foreign_keys(table)),
        }
        for table in insp.get_table_names() if table != "alembic_version"
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_upgrade_keeps_every_row(db_url: str, version: str, tmp_path: Path) -> None:
    load_fixture(db_url, version)
    engine = make_engine(db_url)
    before = snapshot(engine)
    assert len(before["samples"]) == 5 and len(before["steps"]) == 7  # the fixture is filled
    migrate(engine)
    after = snapshot(engine)
    for table, rows in before.items():
        if table == "alembic_version":
            continue
        want = expected_steps(rows) if table == "steps" else rows
        assert len(after[table]) == len(want), f"{table}: {len(want)} rows before, {len(after[table])} after"
        for old, new in zip(want, after[table], strict=True):
            assert {k: new[k] for k in old} == old, table
            added = {k: v for k, v in new.items() if k not in old}
            assert added == {k: (0 if k in ("retries", "lease_token") else None) for k in added}, table
    assert stamps(engine) == [HEAD]
    with engine.connect() as conn:  # the upgraded schema is the models' ...
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    if engine.dialect.name == "sqlite":
        fresh = Store(f"sqlite:///{tmp_path / 'fresh.sqlite'}")  # ... and a new store's, to the column
        assert schema_of(engine) == schema_of(fresh.engine)
        fresh.close()
        with engine.connect() as conn:  # enforcement is back on for the connections the store goes on with
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    engine.dispose()


def test_store_api_reads_an_upgraded_store(db_url: str) -> None:
    load_fixture(db_url, VERSIONS[0])
    store = Store(db_url)
    assert [b.name for b in store.list_batches()] == ["bfcl-ckpt-1", "mcp-run"]
    assert Counter(s.status for s in store.samples(1)) == {"completed": 1, "running": 1, "pending": 1, "failed": 1}
    new_id = store.create_batch("after-upgrade", {}, [("t", {})])
    assert new_id == 3 and len(store.samples(new_id)) == 1  # ids go on after the old rows
    store.close()


def test_sqlite_backup_before_migrating_a_store(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "agentbatch.sqlite"
    load_fixture(f"sqlite:///{path}", "0002")
    with caplog.at_level(logging.WARNING, logger="agentbatch.db"):
        Store(f"sqlite:///{path}").close()
    backup = tmp_path / "agentbatch.sqlite.0002_vllm_metrics.bak"
    assert str(backup) in caplog.text
    con = sqlite3.connect(backup)
    assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [("0002_vllm_metrics",)]
    assert con.execute("SELECT count(*) FROM samples").fetchone() == (5,)
    con.close()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentbatch.db"):
        Store(f"sqlite:///{path}").close()  # up to date: nothing to migrate, no second backup
        Store(f"sqlite:///{tmp_path / 'new.sqlite'}").close()  # a new store has nothing to back up
    assert "backup" not in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".bak") == [backup.name]


def test_store_stamped_with_old_revision_ids(tmp_path: Path) -> None:
    """0005-0007 were once named u18_batch_heartbeat, h01_suite_runs and r16_in_flight_step on branches of
    their own: such a store reads as schema 0007 and a writer upgrades it from there."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    load_fixture(url, "0007")
    with pytest.raises(StoreUnavailable, match="schema 0007_in_flight_step is older"):  # read as the numbered 0007
        Store(url, read_only=True)
    writer = Store(url)
    assert stamps(writer.engine) == [HEAD]
    assert writer.get_batch(1).name == "bfcl-ckpt-1"
    writer.close()

    older = f"sqlite:///{tmp_path / 'older.sqlite'}"
    load_fixture(older, "0005")
    with pytest.raises(StoreUnavailable, match="older than this agentbatch"):
        Store(older, read_only=True)


@pytest.mark.parametrize("stamp", ["h01_suite_runs", "0099_from_a_newer_agentbatch"])
def test_stamp_off_the_chain_is_refused(tmp_path: Path, stamp: str) -> None:
    """The old suite_runs branch without the sample leases of 0003 (an order no release wrote), or a
    revision this agentbatch does not know: refused with the revision named, exit 2, nothing changed."""
    path = tmp_path / "odd.sqlite"
    url = f"sqlite:///{path}"
    load_fixture(url, "0002")
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = ?", (stamp,))
    con.commit()
    con.close()
    engine = make_engine(url)
    before = snapshot(engine)
    with pytest.raises(StoreUnavailable, match=stamp):
        Store(url)
    proc = run_cli_here(["resume", "1", "--no-progress"], url)
    assert proc.returncode == 2 and stamp in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(engine) == before
    engine.dispose()


def test_the_chain_read_from_file_names_is_alembics_own() -> None:
    """`chain()` reads the revisions from the migration files' names (no Alembic import when a store
    is opened): the same revisions, in the same order, as Alembic's walk of the scripts."""
    from alembic.script import ScriptDirectory

    from agentbatch.db.revisions import alembic_config, chain

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert chain() == tuple(reversed([s.revision for s in script.walk_revisions()]))
    assert len(chain()) >= 8 and chain()[0] == "0001_initial"


def test_opening_a_current_store_does_not_import_alembic(tmp_path: Path) -> None:
    """The common case, a store already at the newest schema, is checked with one query."""
    url = f"sqlite:///{tmp_path / 'current.sqlite'}"
    Store(url).close()
    code = ("import sys; from agentbatch.db.store import Store; "
            f"Store({url!r}).close(); Store({url!r}, read_only=True).close(); "
            "print('alembic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
