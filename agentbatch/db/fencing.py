"""Fencing: a write for a leased sample applies only while the writer holds the sample's current token.

Every claim of a sample by a new owner raises `samples.lease_token` (`db/leases.py`); a process keeps
the token it claimed with. Before it writes anything for a sample (a step row, the sample's status,
score, progress, its in-flight mark), the write's own transaction reads the token under lock and
compares: PostgreSQL `SELECT ... FOR UPDATE`; SQLite a no-op `UPDATE ... RETURNING`, which takes the
store's write lock first, so the read is the latest and no claim slips in before the commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, select, update

from agentbatch.db.models import SAMPLES


def locked_tokens(conn: Connection, ids: Iterable[int]) -> dict[int, int]:
    """Each sample's current lease token, its row locked until the caller's transaction ends."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    cols = (SAMPLES.c.id, SAMPLES.c.lease_token)
    if conn.dialect.name == "postgresql":
        q: Any = select(*cols).where(SAMPLES.c.id.in_(wanted)).with_for_update()
    else:  # SQLite: a write statement first, so the store's write lock is held and the read is the latest
        q = update(SAMPLES).where(SAMPLES.c.id.in_(wanted)).values(lease_token=SAMPLES.c.lease_token).returning(*cols)
    return {sid: token for sid, token in conn.execute(q)}


def still_held(conn: Connection, fences: Mapping[int, int], ids: Iterable[int] | None = None) -> set[int]:
    """Of `ids` (every sample of `fences` when None), those whose row still carries the token in
    `fences`; a sample without a fence is not held. Locks the rows for the caller's transaction."""
    wanted = set(fences) if ids is None else {sid for sid in ids if sid in fences}
    current = locked_tokens(conn, wanted)
    return {sid for sid in wanted if current.get(sid) == fences[sid]}
