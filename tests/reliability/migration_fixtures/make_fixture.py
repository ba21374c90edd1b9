"""Write the store fixtures of one schema version: a SQLite dump and a PostgreSQL dump, both filled
with batches, samples, steps, workers, metrics and suite runs.

Run it with the agentbatch of that version on the path (the fixture must come from the code that
wrote such stores, not from today's migrations), and give the revisions to upgrade to, in order:

    git archive <commit> agentbatch | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old AGENTBATCH_TEST_PG_URL=postgresql+psycopg://... \\
        python tests/reliability/migration_fixtures/make_fixture.py 0005 u18_batch_heartbeat

The committed fixtures and the commands that made them are listed in README.md beside this file.
Rows are written only into the tables and columns the schema of that version has, and the duplicate
step completion only where no unique index forbids it (before 0003).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, create_engine, make_url, text

import agentbatch.db

HERE = Path(__file__).parent
TEXT = "it's \"quoted\", ü, 😀, a\nnewline"

# One completed inference step; the others below vary it.
_STEP: dict[str, Any] = {
    "id": 1, "batch_id": 1, "sample_id": 1, "index": 0, "kind": "inference", "status": "completed", "attempt": 1,
    "enqueued_at": 1764700002.0, "started_at": 1764700002.5, "finished_at": 1764700004.75, "worker": "w0",
    "prompt_tokens": 812, "cached_prompt_tokens": 0, "recomputed_tokens": 0, "output_tokens": 64,
    "prefill_s": 0.125, "decode_s": 1.5, "engine_queue_s": 0.01, "tool_calls": 1,
    "request": {"messages": [{"role": "user", "content": TEXT}]},
    "response": {"content": TEXT, "tool_calls": [{"name": "ls", "arguments": {}}]},
    "error": None, "task_run_id": "00000000-0000-4000-8000-00000000000a",
}

ROWS: dict[str, list[dict[str, Any]]] = {
    "batches": [
        {"id": 1, "name": "bfcl-ckpt-1", "config": {"workload": {"kind": "bfcl", "limit": 4}, "note": TEXT},
         "status": "running", "created_at": 1764700000.123456, "started_at": 1764700001.5, "finished_at": None,
         "flow_run_id": "6f1c2d8e-0000-4000-8000-000000000001", "error": None, "heartbeat_at": 1764700100.25},
        {"id": 2, "name": "mcp-run", "config": {"workload": {"kind": "mcp"}}, "status": "failed",
         "created_at": 1764700200.0, "started_at": 1764700201.0, "finished_at": 1764700300.0,
         "flow_run_id": None, "error": TEXT, "heartbeat_at": None},
    ],
    "samples": [
        {"id": 1, "batch_id": 1, "index": 0, "task_id": "multi_turn_base_0", "task": {"q": TEXT, "n": [1, 2]},
         "status": "completed", "steps_done": 3, "score": 1.0, "result": {"valid": True}, "error": None,
         "admitted_at": 1764700002.0, "finished_at": 1764700050.0, "last_worker": "w0",
         "lease_owner": None, "lease_expires_at": None, "retries": 1, "task_group": "base",
         "in_flight_step": None},
        {"id": 2, "batch_id": 1, "index": 1, "task_id": "multi_turn_base_1", "task": {}, "status": "running",
         "steps_done": 1, "score": None, "result": None, "error": None, "admitted_at": 1764700003.0,
         "finished_at": None, "last_worker": "w1", "lease_owner": "host:123:abcd",
         "lease_expires_at": 1764700130.0, "retries": 0, "task_group": "base", "in_flight_step": 1},
        {"id": 3, "batch_id": 1, "index": 2, "task_id": "multi_turn_long_0", "task": {"k": None},
         "status": "pending", "steps_done": 0, "score": None, "result": None, "error": None,
         "admitted_at": None, "finished_at": None, "last_worker": None, "lease_owner": None,
         "lease_expires_at": None, "retries": 0, "task_group": None, "in_flight_step": None},
        {"id": 4, "batch_id": 1, "index": 3, "task_id": "multi_turn_long_1", "task": {}, "status": "failed",
         "steps_done": 1, "score": 0.0, "result": None, "error": TEXT, "admitted_at": 1764700004.0,
         "finished_at": 1764700060.0, "last_worker": "w0", "lease_owner": None, "lease_expires_at": None,
         "retries": 0, "task_group": "long", "in_flight_step": None},
        {"id": 5, "batch_id": 2, "index": 0, "task_id": "t0", "task": {"prompt": "x"}, "status": "failed",
         "steps_done": 0, "score": None, "result": None, "error": "engine down", "admitted_at": 1764700202.0,
         "finished_at": 1764700250.0, "last_worker": None, "lease_owner": None, "lease_expires_at": None,
         "retries": 0, "task_group": None, "in_flight_step": None},
    ],
    "steps": [
        # (sample 1, step 0) completed twice: written before the one-completion index (0003) existed
        {**_STEP},
        {**_STEP, "id": 2, "attempt": 2, "started_at": 1764700005.0, "finished_at": 1764700006.0},
        {**_STEP, "id": 3, "index": 1, "kind": "environment", "worker": "env-0", "prompt_tokens": None,
         "cached_prompt_tokens": None, "recomputed_tokens": None, "output_tokens": None, "prefill_s": None,
         "decode_s": None, "engine_queue_s": None, "request": {"name": "ls"}, "response": {"output": "a b"},
         "task_run_id": None},
        {**_STEP, "id": 4, "index": 2, "cached_prompt_tokens": 800, "output_tokens": 12},
        {**_STEP, "id": 5, "sample_id": 2, "status": "completed"},
        {**_STEP, "id": 6, "sample_id": 2, "index": 1, "kind": "environment", "status": "abandoned",
         "finished_at": None, "response": None, "error": "process died"},
        {**_STEP, "id": 7, "sample_id": 4, "status": "failed", "response": None, "error": TEXT},
    ],
    "workers": [
        {"id": 1, "batch_id": 1, "name": "w0", "kind": "engine", "endpoint": "http://127.0.0.1:8001/v1",
         "settings": {"max_num_seqs": 64}, "metrics": {"kv_cache_usage": 0.5}},
        {"id": 2, "batch_id": 1, "name": "env-0", "kind": "environment", "endpoint": None, "settings": None,
         "metrics": None},
    ],
    "worker_metrics": [
        {"id": 1, "batch_id": 1, "worker": "w0", "t": 1764700010.0, "prefix_cache_queries": 1000.0,
         "prefix_cache_hits": 800.0, "kv_cache_usage": 0.25, "running": 3, "waiting": 1, "preemptions": 0.0,
         "prompt_tokens": 2000.0, "generation_tokens": 300.0},
        {"id": 2, "batch_id": 1, "worker": "w0", "t": 1764700020.0, "prefix_cache_queries": 3000.0,
         "prefix_cache_hits": 2500.0, "kv_cache_usage": None, "running": 2, "waiting": 0, "preemptions": 1.0,
         "prompt_tokens": 5000.0, "generation_tokens": 900.0},
    ],
    "suite_runs": [
        {"batch_id": 1, "suite_key": "3f2a9c0d1e2b4a5c", "workload_kind": "bfcl", "tasks": 4, "tag": "ckpt-1",
         "deployment": None, "deployment_id": None, "priors_source": "history", "priors_runs": 2,
         "priors_tasks": 4},
    ],
}


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(agentbatch.db.__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _fill(url: str, revisions: list[str]) -> None:
    """Upgrade an empty database through `revisions` with the code on the path, then insert ROWS."""
    for rev in revisions:
        command.upgrade(_config(url), rev)
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    one_completion = any(ix.name == "ux_steps_one_completion" for ix in meta.tables["steps"].indexes)
    with engine.begin() as conn:
        for name, rows in ROWS.items():  # parents first (dict order)
            if name in meta.tables:
                table = meta.tables[name]
                if name == "steps" and one_completion:  # the schema forbids the duplicate completion
                    rows = [{**r, "status": "abandoned"} if r["id"] == 2 else r for r in rows]
                conn.execute(table.insert(), [{k: v for k, v in row.items() if k in table.c} for row in rows])
                if conn.dialect.name == "postgresql" and "id" in table.c:  # where a store's own inserts left it
                    conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), max(id)) FROM {name}"))
    engine.dispose()


def make_sqlite(version: str, revisions: list[str]) -> Path:
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite"
        _fill(f"sqlite:///{path}", revisions)
        con = sqlite3.connect(path)
        dump = "\n".join(con.iterdump()) + "\n"
        con.close()
    out = HERE / f"v{version}.sqlite.sql"
    out.write_text(dump)
    return out


def make_postgresql(version: str, revisions: list[str], admin_url: str) -> Path:
    name = f"agentbatch_fixture_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name)
    try:
        _fill(url.render_as_string(hide_password=False), revisions)
        env = {**os.environ, "PGPASSWORD": url.password or ""}
        dump = subprocess.run(
            ["pg_dump", "--inserts", "--no-owner", "--no-privileges", "--no-comments", "-h", url.host or "127.0.0.1",
             "-p", str(url.port or 5432), "-U", url.username or "", name],
            check=True, capture_output=True, text=True, env=env).stdout
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    out = HERE / f"v{version}.postgresql.sql"
    # psql meta-commands (`\\restrict KEY`, random per dump) are not SQL: the fixture is loaded by a driver
    out.write_text("".join(line for line in dump.splitlines(keepends=True) if not line.startswith("\\")))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    version, revisions = argv[0], argv[1:]
    print(make_sqlite(version, revisions))
    print(make_postgresql(version, revisions, os.environ["AGENTBATCH_TEST_PG_URL"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
