"""Store opens (finding 6 and the read-only commands): a read-only open never creates a file, a table or
a migration; `resume` of a finished batch leaves its finished_at and flow run untouched."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from reliability_helpers import bfcl_config
from sqlalchemy import text
from testkit import run_cli_here

from agentbatch.db.engine import StoreUnavailable
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch
from agentbatch.flows.config import BatchConfig


def test_read_only_open_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo.sqlite"
    with pytest.raises(StoreUnavailable, match="no store at"):
        Store(f"sqlite:///{missing}", read_only=True)
    assert not missing.exists() and list(tmp_path.iterdir()) == []

    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="no agentbatch store"):
        Store(f"sqlite:///{empty}", read_only=True)
    assert empty.read_bytes() == b""  # not migrated


def test_read_only_store_reads_and_cannot_write(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    writer = Store(url)
    batch_id = writer.create_batch("b", {}, [("t", {})])
    writer.close()
    reader = Store(url, read_only=True)
    assert reader.get_batch(batch_id).name == "b"
    with pytest.raises(Exception, match="readonly|read-only"):
        with reader.engine.begin() as conn:
            conn.execute(text("UPDATE batches SET name = 'x'"))
    reader.close()


def test_read_only_open_on_postgresql(pg_url: str) -> None:
    with pytest.raises(StoreUnavailable, match="no agentbatch store"):
        Store(pg_url, read_only=True)  # an empty database stays empty
    probe = Store(pg_url, create=False)
    with probe.engine.connect() as conn:
        assert conn.execute(text("select count(*) from information_schema.tables "
                                 "where table_schema = 'public'")).scalar() == 0
    probe.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_resume_of_a_finished_batch_changes_nothing(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    batch_id = create_batch(BatchConfig.model_validate(bfcl_config("finished", limit=2)), store)
    first = run_cli_here(["resume", str(batch_id), "--no-progress"], sqlite_url)
    assert first.returncode == 0, first.stdout + first.stderr
    done = store.get_batch(batch_id)
    assert done.status == "completed" and done.finished_at and done.flow_run_id
    again = run_cli_here(["resume", str(batch_id), "--no-progress"], sqlite_url)
    assert again.returncode == 0, again.stdout + again.stderr
    after = store.get_batch(batch_id)
    assert (after.status, after.finished_at, after.flow_run_id) == ("completed", done.finished_at, done.flow_run_id)
    store.close()


def test_read_only_open_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """`status` / `report` on a store no process has open: no -wal or -shm appears, the bytes stay."""
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    Store(url).close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    reader = Store(url, read_only=True)
    assert reader.get_batch(999) is None and reader.list_batches() == []
    reader.close()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_read_only_reader_refuses_a_store_changed_under_it(tmp_path: Path) -> None:
    """Read without locks (no process had it open), the store is then written and checkpointed by a
    writer: the reader's next read is refused rather than mixing old and new pages."""
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    Store(url).close()
    reader = Store(url, read_only=True)
    assert reader.list_batches() == []
    writer = Store(url)
    writer.create_batch("b", {}, [("t", {})])
    writer.close()  # the last connection checkpoints into the main file
    with pytest.raises(StoreUnavailable, match="changed while it was read"):
        reader.list_batches()
    reader.close()
    again = Store(url, read_only=True)
    assert [b.name for b in again.list_batches()] == ["b"]
    again.close()


def test_open_waits_while_another_process_holds_a_fresh_file(tmp_path: Path) -> None:
    """Switching a file to WAL fails at once, busy timeout or not, while another connection writes to
    it (seen when six processes opened one fresh store: one failed with "database is locked")."""
    path = tmp_path / "fresh.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE scratch (x INTEGER)")
    other.execute("BEGIN IMMEDIATE")  # a write lock on a file not yet in WAL
    other.execute("INSERT INTO scratch VALUES (1)")
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    try:
        store = Store(f"sqlite:///{path}")
        assert store.list_batches() == []
        store.close()
    finally:
        release.join()
        other.close()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
