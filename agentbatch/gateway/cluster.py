"""Several gateway processes (and hosts) serving one batch: who owns a sample, and each process's
share of the batch's limits.

Samples are partitioned by rendezvous hashing of the sample key over the live members: every member
computes the same owner from the same membership, and when a member joins or leaves only the samples
it gains or loses move (1/N of them), the others stay where they were. A request that reaches a
process that does not own its sample is forwarded to the owner (`gateway/routing.py`).

The batch's limits (`max_active_samples`, `per_worker_inflight` of each worker, `env_slots`) are split
among the live members (`slot_share`, as `env_slots_scope: batch` splits environment slots among
`join` processes) and rebalanced on every beat as members come and go. A member never takes more
than the live others leave free (`db/gateway_members.py`): a member that must shrink keeps claiming
what it still holds until its steps give those slots back, so the limits hold across the processes
at every instant, also while they rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentbatch.db import gateway_members as members
from agentbatch.db.leases import new_owner, slot_share
from agentbatch.db.models import BatchStatus
from agentbatch.db.store import Store
from agentbatch.tasks.coordinator import Coordinator

log = logging.getLogger("agentbatch.gateway")
ROUTED_HEADER = "x-agentbatch-routed"  # set on a forwarded request: the receiver serves it itself


@dataclass
class ClusterSettings:
    url: str = ""  # this member's internal base URL (set when its internal socket is bound)
    beat_s: float = 1.0  # how often the membership and the shares are refreshed
    ttl_s: float = 10.0  # a member without a beat for this long is gone (its shares and samples move)
    name: str = ""  # member id (default: host:pid:random)


def _weight(member: str, key: str) -> bytes:
    return hashlib.blake2b(f"{member}\x00{key}".encode(), digest_size=8).digest()


class Cluster:
    """This process's view of the batch's members, its shares, and the owner of each sample."""

    def __init__(self, store: Store, batch_id: int, coordinator: Coordinator, settings: ClusterSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.batch_id = batch_id
        self.coordinator = coordinator
        self.settings = settings
        self.name = settings.name or new_owner()
        self.clock = clock
        # The batch's limits, as configured; this process starts with none of them (its first beat
        # takes its share of what the others leave free).
        self.totals = {name: cap for name, (cap, _) in coordinator.capacities().items()}
        coordinator.set_capacities(dict.fromkeys(self.totals, 0))
        self.urls: dict[str, str] = {}  # the live others' internal URLs
        self.names: list[str] = [self.name]  # the live members, this one included, sorted
        self._task: asyncio.Task[None] | None = None
        self._owners: dict[str, str] = {}  # sample key -> owner, for the current membership
        # Beats and the leave, one at a time (they run in threads): a beat still running when the
        # process leaves would write its member row back after the leave deleted it, and the last
        # member to leave would then see it alive and not finish the batch.
        self._beating = threading.Lock()
        self._left = False

    # --- ownership ---------------------------------------------------------------------------------
    def owner(self, key: str) -> str:
        owner = self._owners.get(key)
        if owner is None:
            owner = self._owners[key] = max(self.names, key=lambda m: _weight(m, key))
        return owner

    def url_of(self, key: str) -> str | None:
        """The internal URL of the member owning sample `key`; None when this process owns it."""
        owner = self.owner(key)
        return None if owner == self.name else self.urls.get(owner)

    def others(self) -> list[str]:
        return [self.urls[n] for n in self.names if n != self.name and n in self.urls]

    # --- shares ------------------------------------------------------------------------------------
    def _decide(self, live: list[members.Member]) -> dict[str, int]:
        """This member's caps (written with its beat) and the capacities it applies after the commit."""
        names = sorted({m.name for m in live} | {self.name})
        held = self.coordinator.capacities()
        caps, self._apply = {}, {}
        for pool, total in self.totals.items():
            claimed = sum(m.caps.get(pool, total) for m in live)  # a member that named none: all of it
            cap = max(0, min(slot_share(total, names, self.name), total - claimed))
            self._apply[pool] = cap
            # Until the new capacity is applied (after the commit) the old one may still be filled,
            # and slots held beyond a shrunk capacity count until they are given back.
            caps[pool] = max(cap, *held[pool])
        return caps

    def beat(self) -> None:
        """One beat (blocking: run in a thread): membership and shares refreshed; none after the leave."""
        with self._beating:
            if not self._left:
                self._beat()

    def _beat(self) -> None:
        live = members.beat(self.store, self.batch_id, self.name, self.settings.url, self.clock(),
                            self.settings.ttl_s, self._decide)
        names = sorted([m.name for m in live] + [self.name])
        if names != self.names:
            log.info("gateway batch %s: %d process(es) serve it now", self.batch_id, len(names))
            self._owners.clear()
        self.names, self.urls = names, {m.name: m.url for m in live}

    def apply(self) -> None:
        """Use the capacities the last beat chose (on the event loop: grants go to waiters)."""
        self.coordinator.set_capacities(self._apply)

    async def start(self) -> None:
        await asyncio.to_thread(self.beat)
        self.apply()
        self._task = asyncio.create_task(self._run(), name="agentbatch-gateway-members")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.beat_s)
            try:
                await asyncio.to_thread(self.beat)
            except Exception:  # noqa: BLE001 - the store is down for a moment: the next beat tries again
                log.exception("gateway batch %s: membership beat failed", self.batch_id)
                continue
            self.apply()

    async def leave(self, status: BatchStatus, error: str | None) -> bool:
        """Stop beating and leave; True when this was the last member (the batch is finished then)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return await asyncio.to_thread(self._leave, status, error)

    def _leave(self, status: BatchStatus, error: str | None) -> bool:
        with self._beating:  # after a beat that is still running
            self._left = True
            return members.leave(self.store, self.batch_id, self.name, self.clock(), self.settings.ttl_s,
                                 status=status, error=error)
