"""The schema revision of a store: Alembic's configuration, the numbered chain of migrations, the ids
stores were stamped with before the chain was numbered, and the SQLite backup taken before a migration.

Migrations form one chain, `0001_initial` ... `0008_lease_token`. Until they were numbered, 0004 to
0007 were branches of their own (0005-0007 under other ids), and a store kept one row per branch head
in `alembic_version`; `chain_revision` reads such a stamp as the position on the chain it amounts to.
"""

from __future__ import annotations

import sqlite3
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

if TYPE_CHECKING:  # Alembic is imported only where a store is migrated: every command opens a store
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

# The revision graph before numbering (revision -> the one it revised) and the ids renamed since.
LEGACY_PARENTS: dict[str, str | None] = {
    "0001_initial": None,
    "0002_vllm_metrics": "0001_initial",
    "0003_sample_leases": "0002_vllm_metrics",
    "0004_sample_group": "0002_vllm_metrics",
    "u18_batch_heartbeat": "0002_vllm_metrics",
    "h01_suite_runs": "0002_vllm_metrics",
    "r16_in_flight_step": "0003_sample_leases",
}
LEGACY_RENAMED = {"u18_batch_heartbeat": "0005_batch_heartbeat", "h01_suite_runs": "0006_suite_runs",
                  "r16_in_flight_step": "0007_in_flight_step"}


class StampError(Exception):
    """A store stamped with revisions that are not a position on the chain (unknown, or out of order)."""


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@cache
def chain() -> tuple[str, ...]:
    """Every revision, oldest first: each migration file is named after its revision, numbered in
    order (tests/reliability/test_reliability_migrations.py checks this against Alembic's own walk)."""
    return tuple(sorted(p.stem for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")))


def head() -> str:
    return chain()[-1]


def stamp_of(conn: Connection) -> set[str]:
    """The rows of `alembic_version` (empty: no agentbatch schema)."""
    if not inspect(conn).has_table("alembic_version"):
        return set()
    return {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}


def chain_revision(stamp: set[str]) -> str | None:
    """The revision of the chain that a stamp (current or from before numbering) amounts to."""
    if not stamp:
        return None
    if len(stamp) == 1 and next(iter(stamp)) in chain():
        return next(iter(stamp))
    applied: set[str] = set()
    for head in stamp:
        rev: str | None = head
        while rev is not None and rev not in applied:
            if rev not in LEGACY_PARENTS:
                raise StampError(f"the store is stamped with revision {rev!r}, which this agentbatch does not "
                                 f"know (written by a newer version?); its revisions: {', '.join(chain())}")
            applied.add(rev)
            rev = LEGACY_PARENTS[rev]
    done = {LEGACY_RENAMED.get(rev, rev) for rev in applied}
    position = 0
    while position < len(chain()) and chain()[position] in done:
        position += 1
    if done - set(chain()[:position]):
        raise StampError(f"the store is stamped {sorted(stamp)}: migrations {sorted(done - set(chain()[:position]))} "
                         f"were applied without {chain()[position]}, an order no release of agentbatch wrote; "
                         "upgrade it with the agentbatch that wrote it, or start a new store")
    return chain()[position - 1]


def restamp(conn: Connection, revision: str) -> None:
    """Replace the stamp by one chain revision (inside the caller's transaction)."""
    conn.execute(text("DELETE FROM alembic_version"))
    conn.execute(text("INSERT INTO alembic_version (version_num) VALUES (:rev)"), {"rev": revision})


def backup_sqlite(path: Path, revision: str) -> Path:
    """A consistent copy of a SQLite store (the online backup API: fine beside the caller's write lock),
    named after the revision it holds; an existing backup is never overwritten."""
    target = path.with_name(f"{path.name}.{revision}.bak")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{revision}.{n}.bak")
    src = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return target
