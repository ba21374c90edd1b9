"""The processes that serve one gateway batch together (`agentbatch gateway --processes N`, and
gateway hosts that join the batch with `--batch ID`): one `workers` row each, kind `gateway`.

A member's row holds its internal URL (where the others forward the requests of its samples), its
last beat and the capacities it may use now (`caps`: admission slots, each worker's in-flight slots,
environment slots). A member is live while its beat is younger than the time to live. Each beat
runs under a lock on the batch row, so the members' decisions are serialised: a member grows its
capacities only into what the live others do not claim, and claims at least what it holds, so the
caps of the live members never add up to more than the batch's limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from agentbatch.db.models import Batch, BatchStatus, Worker
from agentbatch.db.store import Store

MEMBER_KIND = "gateway"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    url: str
    beat: float
    caps: dict[str, int] = field(default_factory=dict)


def _lock_batch(s: Session, batch_id: int) -> None:
    # PostgreSQL: members' beats wait on each other here; SQLite serialises writers anyway.
    s.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update())


def _beat_batch(s: Session, batch_id: int, now: float) -> None:
    # The batch is alive while a member beats (`status` reads a running batch without beats crashed).
    s.execute(update(Batch).where(Batch.id == batch_id).values(heartbeat_at=now))


def _members(s: Session, batch_id: int) -> list[Worker]:
    return list(s.scalars(select(Worker).where(Worker.batch_id == batch_id, Worker.kind == MEMBER_KIND)))


def _as_member(row: Worker) -> Member:
    metrics = row.metrics or {}
    return Member(row.name, row.endpoint or "", float(metrics.get("beat", 0.0)), dict(metrics.get("caps") or {}))


def beat(store: Store, batch_id: int, name: str, url: str, now: float, ttl_s: float,
         decide: Callable[[list[Member]], dict[str, int]]) -> list[Member]:
    """This member is alive: under the batch lock, read the live others, let `decide` choose this
    member's caps from theirs, and write them with the beat. Returns the live others."""
    with store.session() as s, s.begin():
        _lock_batch(s, batch_id)
        rows = _members(s, batch_id)
        others = [_as_member(r) for r in rows if r.name != name]
        live = [m for m in others if m.beat >= now - ttl_s]
        caps = decide(live)
        own = next((r for r in rows if r.name == name), None)
        if own is None:
            own = Worker(batch_id=batch_id, name=name, kind=MEMBER_KIND)
            s.add(own)
        own.endpoint = url
        own.metrics = {"beat": now, "caps": caps}
        _beat_batch(s, batch_id, now)
    return live


def leave(store: Store, batch_id: int, name: str, now: float, ttl_s: float, *,
          status: BatchStatus, error: str | None = None) -> bool:
    """This member stops: its row goes; the last live member to leave finishes the batch (True then)."""
    with store.session() as s, s.begin():
        _lock_batch(s, batch_id)
        s.execute(delete(Worker).where(Worker.batch_id == batch_id, Worker.kind == MEMBER_KIND, Worker.name == name))
        if any(_as_member(r).beat >= now - ttl_s for r in _members(s, batch_id)):
            return False
        batch = s.get_one(Batch, batch_id)
        batch.status = status
        batch.finished_at = now
        batch.error = error
        return True
