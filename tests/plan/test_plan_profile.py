"""The resource model against the simulated engine's profiles (no simulation: the pick alone)."""

from __future__ import annotations

from agentbatch.planning import concurrency_for_profile, workload_from_trace
from agentbatch.sim.profiles import get_profile
from agentbatch.traces.generators import generate


def _pick(*args: object, **kwargs: object) -> tuple[int, dict[str, float]]:
    pick = concurrency_for_profile(*args, **kwargs)
    return pick.n_ref, pick.bounds


def test_pick_for_dense_profile_is_memory_aware() -> None:
    trace = generate("swe_like", samples=60, seed=2)
    profile = get_profile("llama3-8b-h100")
    n, bounds = _pick(trace, profile)
    strict, sb = _pick(trace, profile, allow_recompute=False)
    wl = workload_from_trace(trace, decode_tokens_per_s=bounds["decode_tokens_per_s"], source="t")
    per_sample = wl.mean_context - wl.shared_prefix + profile.block_size / 2
    # N_mem: all admitted samples' unique KV fits the profile's KV capacity (with the spread margin)
    assert sb["n_mem"] * per_sample <= profile.kv_capacity_tokens
    assert (sb["n_mem"] + 2) * per_sample > profile.kv_capacity_tokens * 0.8
    assert strict == min(sb["n_mem"], sb["n_busy"], 60)
    assert strict <= n <= 60
    assert 0 < bounds["env_fraction"] < 1


def test_pick_for_hybrid_profile_respects_checkpoints() -> None:
    trace = generate("bfcl_like", samples=300, seed=2)
    profile = get_profile("ling-flash-2.0-h200")
    n, bounds = _pick(trace, profile, allow_recompute=False)
    groups = len({s.prefix_group for s in trace.samples})
    assert n <= profile.state_checkpoints - groups  # one checkpoint per admitted sample + one per prefix
    n2, _ = _pick(
        trace, profile.replace(state_checkpoints=profile.state_checkpoints * 2), allow_recompute=False
    )
    assert n2 > n


def test_workers_multiply() -> None:
    trace = generate("mcp_like", samples=100, seed=2)
    profile = get_profile("llama3-8b-h100")
    one, _ = _pick(trace, profile)
    two, _ = _pick(trace, profile, workers=2)
    assert two <= 2 * one and two % 2 == 0


def test_pick_when_checkpoints_hold_no_sample_beyond_the_prefixes() -> None:
    # A scaled-down hybrid engine whose checkpoint pool holds only the shared prefixes: N_mem is 0.
    # The pick must not divide by f x N = 0 (it did), and with recompute allowed it still admits
    # samples: they recompute their state on return, which the goodput model prices.
    trace = generate("mcp_like", samples=20, seed=1, epoch=1)
    base = get_profile("ling-flash-2.0-h200")
    profile = base.replace(num_kv_blocks=base.num_kv_blocks // 20, max_num_seqs=max(4, base.max_num_seqs // 20),
                           state_slots=max(4, (base.state_slots or 0) // 20), state_checkpoints=2)
    n, bounds = _pick(trace, profile)
    assert bounds["n_mem"] == 0
    assert 1 <= n <= 20
    strict, _ = _pick(trace, profile, allow_recompute=False)
    assert strict == 1  # nothing fits cached: one sample at a time, never zero
