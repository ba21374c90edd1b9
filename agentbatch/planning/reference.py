"""Reference concurrency for an engine described by its pool capacities (e.g. a simulated profile).

Two pools, as the simulated engine and SGLang keep them: paged KV of `kv_capacity_tokens` and, for
hybrid models, `checkpoint_slots` saved recurrent states. A cached sample holds
(context - prefix + block/2) KV tokens and one checkpoint. B_busy comes from a cost model (or is
given); with the workload's output/new tokens per step, N may pass N_mem where the predicted
goodput says so (`demand.goodput_pick`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbatch.planning.demand import Goodput, goodput_pick, largest, overflow, returning_evicted
from agentbatch.planning.errors import PlanError
from agentbatch.planning.inputs import LinearCost
from agentbatch.planning.workload import Workload
from agentbatch.planning.workload_sources import workload_from_trace


@dataclass(frozen=True)
class ConcurrencyPick:
    n_ref: int  # samples to admit at once (all workers together for concurrency_for_profile)
    bounds: dict[str, float] = field(default_factory=dict)  # n_mem, n_busy, b_busy, goodput terms, ...


@dataclass(frozen=True)
class _Pools:
    """The capacity arithmetic of one worker for one workload."""

    kv_capacity_tokens: int
    block_size: int
    workload: Workload
    checkpoint_slots: int | None
    cap_run: float  # most sequences running at once

    @property
    def per_sample(self) -> float:
        wl = self.workload
        return wl.mean_context - wl.shared_prefix + self.block_size / 2

    @property
    def prefix_copies(self) -> int:
        return self.workload.prefix_groups if self.workload.shared_prefix else 0

    def kv_tokens(self, n: int) -> float:
        return n * self.per_sample + self.workload.prefix_groups * self.workload.shared_prefix

    def fits(self, n: int, safety_z: float) -> bool:
        if self.kv_tokens(n) + safety_z * math.sqrt(n) * self.workload.std_context > self.kv_capacity_tokens:
            return False
        return self.checkpoint_slots is None or n + self.prefix_copies <= self.checkpoint_slots

    def evicted(self, n: int) -> float:
        if n <= 0:  # nothing admitted, nothing evicted (N_mem is 0 where the pools hold no sample)
            return 0.0
        f = self.workload.env_fraction
        over = overflow(self.kv_tokens(n), math.sqrt(n) * self.workload.std_context, self.kv_capacity_tokens)
        waiting = f * n * self.per_sample
        e = min(1.0, over / waiting) if waiting > 0 else float(over > 0)
        if self.checkpoint_slots is not None:
            excess = max(0.0, n + self.prefix_copies - self.checkpoint_slots)
            e = max(e, min(1.0, excess / (f * n)) if f > 0 else float(excess > 0))
        return e

    def running_ok(self, n: int) -> bool:
        wl = self.workload
        running = min((1 - wl.env_fraction) * n, self.cap_run)
        return running * self.per_sample + wl.prefix_groups * wl.shared_prefix <= self.kv_capacity_tokens


def _busy_running(cost: LinearCost | None, target_running: int | None, mu: float, busy_fraction: float,
                  cap_run: float) -> int:
    if cost is None and target_running is None:
        raise PlanError("reference_concurrency needs a cost model or target_running for B_busy")
    if target_running is not None:
        b_busy = target_running
    else:
        assert cost is not None
        asym = 1.0 / (cost.c_decode + cost.c_attn * mu)
        b_busy = largest(lambda n: n / cost.decode_step(n, mu) < busy_fraction * asym, hi=1 << 20) + 1
    return int(min(b_busy, cap_run))


def reference_concurrency(
    *,
    kv_capacity_tokens: int,
    block_size: int,
    workload: Workload,
    checkpoint_slots: int | None = None,
    max_running: int | None = None,
    target_running: int | None = None,
    cost: LinearCost | None = None,
    busy_fraction: float = 0.9,
    safety_z: float = 1.645,
    allow_recompute: bool = True,
    goodput_tolerance: float = 0.02,
) -> ConcurrencyPick:
    """N_ref for an engine described by its pool capacities (see the module doc).

    `max_running` caps the running batch (max-num-seqs, or the state slots); `checkpoint_slots`
    None means a dense model.
    """
    wl = workload
    f, mu = wl.env_fraction, wl.mean_context
    cap_run = float(max_running) if max_running else float("inf")
    pools = _Pools(kv_capacity_tokens, block_size, wl, checkpoint_slots, cap_run)
    n_mem = largest(lambda n: pools.fits(n, safety_z))
    b_busy = _busy_running(cost, target_running, mu, busy_fraction, cap_run)
    n_busy = math.ceil(b_busy / (1 - f))
    n_cap = min(n_busy, wl.num_samples or n_busy)
    bounds: dict[str, float] = {"n_mem": n_mem, "n_busy": n_busy, "b_busy": b_busy}
    n_ref = min(n_mem, n_cap)
    if allow_recompute and cost is not None and n_cap > n_mem and wl.output_tokens and wl.new_tokens is not None:
        c = cost
        gp = Goodput(lambda r: c.decode_step(r, mu), c.c_prefill, wl.output_tokens, wl.new_tokens, f, cap_run)
        tail = block_size / 2
        pick = goodput_pick(
            n_mem,
            n_cap,
            gp,
            lambda n: returning_evicted(pools.evicted(n), wl.env_durations) * (mu - wl.shared_prefix) + tail,
            pools.running_ok,
            goodput_tolerance,
        )
        bounds.update(
            n_goodput=pick.n, goodput_tok_s=pick.goodput, goodput_best_tok_s=pick.best,
            goodput_at_n_mem=gp(n_mem, tail),
        )  # fmt: skip
        n_ref = max(n_ref, pick.n)
    return ConcurrencyPick(max(1, n_ref), bounds)


class EngineProfileLike(Protocol):
    """What `concurrency_for_profile` reads of a simulated engine profile (sim.profiles.EngineProfile)."""

    cost: Any  # c0, c_prefill, c_decode, c_attn
    max_num_seqs: int
    state_slots: int | None
    state_checkpoints: int
    kv_capacity_tokens: int
    block_size: int


def concurrency_for_profile(
    trace: Any,
    profile: EngineProfileLike,
    *,
    workers: int = 1,
    iterations: int = 4,
    allow_recompute: bool = True,
) -> ConcurrencyPick:
    """Reference concurrency (all workers together) for a trace on simulated-engine workers.

    `profile` is an `EngineProfile` (sim/profiles.py): its KV capacity, block size,
    checkpoint pool, max running batch and cost model are the engine. The trace's inference steps
    carry no durations, so the environment fraction f depends on the engine's speed: start from
    40 tokens/s per sequence, then re-estimate the per-sequence decode rate 1 / t_decode(R) at the
    running batch R = (1 - f) N_ref the plan picks, a few times (a fixed point).
    """
    c = profile.cost
    cost = LinearCost(c.c0, c.c_prefill, c.c_decode, c.c_attn)
    max_running = min(profile.max_num_seqs, profile.state_slots or profile.max_num_seqs)
    rate = 40.0
    pick = ConcurrencyPick(1, {})
    for _ in range(max(1, iterations)):
        wl = workload_from_trace(trace, decode_tokens_per_s=rate, source="trace")
        if wl.num_samples:
            wl = wl.replace(num_samples=max(1, wl.num_samples // workers))
        pick = reference_concurrency(
            kv_capacity_tokens=profile.kv_capacity_tokens,
            block_size=profile.block_size,
            workload=wl,
            checkpoint_slots=profile.state_checkpoints if profile.state_slots is not None else None,
            max_running=max_running,
            cost=cost,
            allow_recompute=allow_recompute,
        )
        running = max(1.0, min(pick.n_ref * (1 - wl.env_fraction), max_running))
        rate = 1.0 / cost.decode_step(running, wl.mean_context)
        pick = ConcurrencyPick(pick.n_ref, dict(pick.bounds, env_fraction=wl.env_fraction, decode_tokens_per_s=rate))
    return ConcurrencyPick(pick.n_ref * workers, pick.bounds)
