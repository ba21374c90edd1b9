"""Sample leases: one process drives a sample at a time.

A process claims unfinished samples of a batch by writing its owner id (`host:pid:random`) and an
expiry into `samples.lease_owner` / `lease_expires_at`, renews them while it runs, and releases them
when a sample ends or the process stops. A lease that expired (its process hung or died on another
host) can be taken over; a lease of a process on this host whose pid is gone is taken over at once,
so a `resume` right after a SIGKILL does not wait for the expiry.

Claims are atomic: PostgreSQL selects the candidates `FOR UPDATE SKIP LOCKED` (two claimers never
wait on, or take, the same row); SQLite serialises writers, so one conditional UPDATE is enough.
Fencing: every claim by a new owner raises the sample's `lease_token`; the holder keeps the token it
claimed with (`tokens`) and the step writer commits a write for the sample only if the row still
carries that token, checked under lock in the write's own transaction (`db/writer.py`). A process
whose lease was taken over (it was paused past the expiry) thus writes nothing more for the sample:
its write fails with `LeaseLost`, and it lets the sample go. The store's partial unique index on
completed steps stays as a last line.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, and_, case, func, or_, select, update
from sqlalchemy.exc import DBAPIError

from agentbatch.db.fencing import still_held
from agentbatch.db.models import MAY_HAVE_EXECUTED, Sample, SampleStatus, Step, StepStatus
from agentbatch.db.store import Store

UNFINISHED = (SampleStatus.PENDING, SampleStatus.RUNNING)


class LeaseLost(BaseException):
    """A write for a sample whose lease another process took over (its fencing token moved on).

    A BaseException, as CancelledError is: no `except Exception` on the way up (step retries, the
    handler that marks a sample failed) may turn it into a failure of a sample this process no longer
    drives; `LeaseKeeper.run` lets the sample go."""

    def __init__(self, sample_id: int) -> None:
        super().__init__(f"sample {sample_id}: its lease was taken over by another process")
        self.sample_id = sample_id


def new_owner() -> str:
    """A lease owner id: host, pid and a random part (a pid can be reused; the random part cannot)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner_is_dead_here(owner: str) -> bool:
    """True when `owner` names a process on this host that no longer exists."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    return not _pid_alive(int(pid_text))


def dead_drivers(store: Store, batch_id: int, now: float | None = None) -> list[str]:
    """The processes holding unexpired leases on the batch's unfinished samples, when every one of them
    is a process of this host that no longer exists (the batch has crashed, at once, not after its
    heartbeat goes stale); empty when one may be alive or no lease is held."""
    q = (select(Sample.lease_owner).distinct()
         .where(Sample.batch_id == batch_id, Sample.status.in_(UNFINISHED), Sample.lease_owner.is_not(None),
                Sample.lease_expires_at >= (time.time() if now is None else now)))
    with store.session() as s:
        owners = sorted(o for o in s.scalars(q) if o)
    return owners if owners and all(owner_is_dead_here(o) for o in owners) else []


@dataclass(frozen=True, slots=True)
class ForeignLease:
    """A live lease of another process on a sample this process could not claim."""

    sample_id: int
    owner: str
    expires_at: float


class SampleLeases:
    """The leases one process holds on the samples of one batch."""

    def __init__(self, store: Store, batch_id: int, owner: str | None = None, ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.store = store
        self.batch_id = batch_id
        self.owner = owner or new_owner()
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: set[int] = set()
        self.tokens: dict[int, int] = {}  # sample id -> the fencing token this process claimed it with
        # Renewed every ttl/3 (flows/leased.py): bounded by ttl/3, a transaction this process stalls in
        # has ended, its row locks gone, before the leases it renewed last can expire.
        store.bound_stalled_transactions(ttl_s / 3)

    # --- claiming --------------------------------------------------------------------------------
    def _claimable(self, now: float, new_only: bool = False) -> Select[int]:
        free = or_(Sample.lease_owner.is_(None), Sample.lease_expires_at < now)
        return (
            select(Sample.id)
            .where(
                Sample.batch_id == self.batch_id,
                Sample.status.in_(UNFINISHED),
                free if new_only else or_(free, Sample.lease_owner == self.owner),
            )
            .order_by(Sample.index)
        )

    def claim(self, limit: int | None = None, *, among: list[int] | None = None,
              new_only: bool = False) -> list[Sample]:
        """Lease up to `limit` unfinished samples nobody else holds (all when None), only among these
        ids when given; `new_only`: not counting (nor extending) the ones this object holds already.
        Returns every sample this object holds after the claim, in index order."""
        self._expire_dead_owners()
        now = self.clock()
        candidates = self._claimable(now, new_only)
        if among is not None:
            candidates = candidates.where(Sample.id.in_(among))
        if limit is not None:
            candidates = candidates.limit(limit)
        again_once(lambda: self._take(candidates, now))
        mine = self.store_samples(Sample.lease_owner == self.owner)
        self._held = {m.id for m in mine}
        self.tokens.update((m.id, m.lease_token) for m in mine)
        return mine

    def _take(self, candidates: Select[int], now: float) -> None:
        with self.store.session() as s, s.begin():
            if s.get_bind().dialect.name == "postgresql":
                ids = list(s.scalars(candidates.with_for_update(skip_locked=True)))
                where = Sample.id.in_(ids)
            else:  # SQLite: the UPDATE takes the write lock; its subquery sees a stable snapshot
                ids = None
                where = Sample.id.in_(candidates.scalar_subquery())
            if ids != []:
                # a new owner raises the token; this owner's own leases keep theirs (only extended)
                token = case((Sample.lease_owner == self.owner, Sample.lease_token), else_=Sample.lease_token + 1)
                s.execute(update(Sample).where(where)
                          .values(lease_owner=self.owner, lease_expires_at=now + self.ttl_s, lease_token=token)
                          .execution_options(synchronize_session=False))

    def _expire_dead_owners(self) -> None:
        """Free leases of processes on this host that died (SIGKILL): no need to wait for expiry."""
        q = (select(Sample.lease_owner).distinct()
             .where(Sample.batch_id == self.batch_id, Sample.lease_owner.is_not(None),
                    Sample.lease_owner != self.owner))
        with self.store.session() as s:
            owners = [o for o in s.scalars(q) if o is not None and owner_is_dead_here(o)]
        for owner in owners:
            with self.store.session() as s, s.begin():
                s.execute(update(Sample).where(Sample.batch_id == self.batch_id, Sample.lease_owner == owner)
                          .values(lease_owner=None, lease_expires_at=None))

    # --- holding ---------------------------------------------------------------------------------
    def renew(self) -> set[int]:
        """Extend every held lease; returns the ids still held (a lease another process took over
        after it expired is dropped from `held`)."""
        if not self._held:
            return set()
        now = self.clock()
        with self.store.session() as s, s.begin():
            s.execute(update(Sample)
                      .where(Sample.id.in_(self._held), Sample.lease_owner == self.owner)
                      .values(lease_expires_at=now + self.ttl_s)
                      .execution_options(synchronize_session=False))
            # Finished samples stay held until released: only a lease now owned by another process
            # is lost (a sample that just completed must not count as taken over).
            self._held = set(s.scalars(select(Sample.id).where(Sample.id.in_(self._held),
                                                                Sample.lease_owner == self.owner)))
        return set(self._held)

    def release(self, *sample_ids: int) -> None:
        """Give back these samples' leases, in one transaction."""
        with self.store.session() as s, s.begin():
            s.execute(update(Sample).where(Sample.id.in_(sample_ids), Sample.lease_owner == self.owner)
                      .values(lease_owner=None, lease_expires_at=None))
        self._held.difference_update(sample_ids)

    def release_all(self) -> None:
        with self.store.session() as s, s.begin():
            s.execute(update(Sample).where(Sample.batch_id == self.batch_id, Sample.lease_owner == self.owner)
                      .values(lease_owner=None, lease_expires_at=None))
        self._held.clear()

    def held(self) -> set[int]:
        return set(self._held)

    # --- others ----------------------------------------------------------------------------------
    def claimable_count(self) -> int:
        """How many unfinished samples a `claim` now could take (a read; claims nothing)."""
        self._expire_dead_owners()
        with self.store.session() as s:
            return len(list(s.scalars(self._claimable(self.clock()))))

    def foreign(self) -> list[ForeignLease]:
        """Unexpired leases of other processes on unfinished samples of the batch."""
        now = self.clock()
        rows = self.store_samples(and_(Sample.lease_owner.is_not(None), Sample.lease_owner != self.owner,
                                       Sample.lease_expires_at >= now))
        return [ForeignLease(r.id, r.lease_owner or "", r.lease_expires_at or 0.0) for r in rows]

    def live_owners(self) -> list[str]:
        """The processes driving the batch now (owners of unexpired leases on its unfinished
        samples) and this one, in a fixed order every process sees alike."""
        q = (select(Sample.lease_owner).distinct()
             .where(Sample.batch_id == self.batch_id, Sample.status.in_(UNFINISHED),
                    Sample.lease_owner.is_not(None), Sample.lease_expires_at >= self.clock()))
        with self.store.session() as s:
            owners = {o for o in s.scalars(q) if o}
        return sorted(owners | {self.owner})

    def store_samples(self, condition: ColumnElement[bool]) -> list[Sample]:
        q = (select(Sample)
             .where(Sample.batch_id == self.batch_id, Sample.status.in_(UNFINISHED), condition)
             .order_by(Sample.index))
        with self.store.session() as s:
            return list(s.scalars(q))


def slot_share(total: int, owners: list[str], owner: str) -> int:
    """This owner's part of `total` slots split among `owners` (the first `total % n` get one more);
    at least 1, so a process always makes progress (the sum then exceeds a total below n)."""
    n = max(1, len(owners))
    rank = owners.index(owner) if owner in owners else n - 1
    return max(1, total // n + (1 if rank < total % n else 0))


# --- external environment steps cut short by a crash ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class InFlight:
    """A step of an external-state environment that was executing when its process died."""

    sample_id: int
    step_index: int


def flag_in_flight(store: Store, fences: Mapping[int, int]) -> list[InFlight]:
    """Record each step left in flight (`samples.in_flight_step`) among these samples (sample id -> the
    lease token the caller holds) as an `abandoned` attempt flagged "may have executed", and clear the
    mark; only for the samples whose row still carries that token, checked in the same transaction
    (`db/fencing.py`): a process that lost a sample's lease flags nothing of it."""
    if not fences:
        return []
    with store.session() as s, s.begin():
        held = sorted(still_held(s.connection(), fences))
        rows = list(s.execute(select(Sample.id, Sample.batch_id, Sample.in_flight_step)
                              .where(Sample.id.in_(held), Sample.in_flight_step.is_not(None))))
        now = time.time()
        for sample_id, batch_id, index in rows:
            last = s.scalar(select(Step).where(Step.sample_id == sample_id, Step.index == index)
                            .order_by(Step.attempt.desc()).limit(1))
            if last is not None and last.status in (StepStatus.RUNNING, StepStatus.ABANDONED):
                # the attempt's own `running` row (the writer commits it before an external step runs)
                last.status, last.error, last.finished_at = StepStatus.ABANDONED, MAY_HAVE_EXECUTED, now
                continue
            s.add(Step(batch_id=batch_id, sample_id=sample_id, index=index, kind="environment",
                       status=StepStatus.ABANDONED, attempt=(last.attempt if last else 0) + 1, enqueued_at=now,
                       started_at=now, finished_at=now, error=MAY_HAVE_EXECUTED))
        if rows:
            s.execute(update(Sample).where(Sample.id.in_([r[0] for r in rows])).values(in_flight_step=None)
                      .execution_options(synchronize_session=False))
    return [InFlight(sample_id, index) for sample_id, _, index in rows if index is not None]


def count_may_have_executed(store: Store, batch_id: int) -> int:
    with store.session() as s:
        return s.scalar(select(func.count()).select_from(Step).where(
            Step.batch_id == batch_id, Step.error.startswith(MAY_HAVE_EXECUTED, autoescape=True))) or 0


def again_once(write: Callable[[], None]) -> None:
    """`write` (one transaction), run a second time when the server had ended the connection under
    it: a transaction this process stalled in past `Store.bound_stalled_transactions`."""
    try:
        write()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        write()
