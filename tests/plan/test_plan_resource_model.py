"""The resource model on hand-computable shapes: the split, the concurrency, the engine settings."""

from __future__ import annotations

import math

import pytest

from agentbatch.planning.model_shape import shape_from_config
from agentbatch.planning.resource_model import (
    EngineOptions,
    Hardware,
    LinearCost,
    PlanError,
    Workload,
    plan,
    reference_concurrency,
    vllm_block_size,
)

GIB = 1 << 30

# 2 layers, 2 KV heads x 64 head_dim, bf16: 2 x (2 x 2 x 64 x 2) = 1024 B per token
DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "torch_dtype": "bfloat16",
    "vocab_size": 1000,
}
# 8 layers, 1 attention in 8 (KV 2 x 1 x 32 x 2 = 128 B/token); 7 linear layers of 4 x 32 x 32 x 4 B = 16 KiB state
HYBRID = {
    "model_type": "bailing_moe_linear",
    "num_hidden_layers": 8,
    "layer_group_size": 8,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "torch_dtype": "bfloat16",
}


def p99_running(n: int, f: float) -> int:
    return min(n, math.ceil(n * (1 - f) + 2.326 * math.sqrt(n * f * (1 - f))))


def test_dense_two_layer_model() -> None:
    shape = shape_from_config(DENSE, weights_bytes=GIB)
    assert shape.kv_bytes_per_token == 1024
    hw = Hardware(11 * GIB, gpu_util=1.0, reserve_bytes=0)
    wl = Workload(contexts=(10_000.0,), env_fraction=0.5)
    p = plan(shape, hw, wl, EngineOptions(target_running=100))
    assert p.cache_bytes == 10 * GIB
    assert p.block_size == 16
    # a cached sample: (10000 + 16/2) tokens x 1024 B; no spread, no state, no prefix
    assert p.n_mem == (10 * GIB) // (10_008 * 1024) == 1047
    assert p.n_busy == 200  # B_busy / (1 - f) = 100 / 0.5
    assert (p.reference_concurrency, p.binding) == (200, "busy")
    assert p.max_num_seqs == p99_running(200, 0.5) == 117
    assert p.state_pool_bytes == 0 and p.kv_pool_bytes == 10 * GIB
    assert p.vllm_args["--max-num-seqs"] == 117 and p.vllm_args["--block-size"] == 16
    assert p.vllm_args["--enable-prefix-caching"] is True
    assert "--mamba-cache-mode" not in p.vllm_args and "--max-mamba-cache-size" not in p.sglang_args
    # below N_mem nothing is evicted: only the half block of tail is recomputed
    assert p.recompute_tokens_per_step == pytest.approx(8.0)


def test_dense_memory_bound_and_batch_bound() -> None:
    shape = shape_from_config(DENSE, weights_bytes=GIB)
    hw = Hardware(11 * GIB, gpu_util=1.0, reserve_bytes=0)
    p = plan(shape, hw, Workload(contexts=(10_000.0,), env_fraction=0.5), EngineOptions(target_running=1000))
    assert (p.reference_concurrency, p.binding) == (1047, "memory")
    p = plan(
        shape,
        hw,
        Workload(contexts=(10_000.0,), env_fraction=0.5, num_samples=50),
        EngineOptions(target_running=1000),
    )
    assert (p.reference_concurrency, p.binding) == (50, "batch")


def test_hybrid_one_in_eight() -> None:
    shape = shape_from_config(HYBRID, weights_bytes=0)
    assert shape.kv_bytes_per_token == 128
    assert shape.state_bytes_per_seq == 7 * 4 * 32 * 32 * 4 == 114_688
    assert shape.token_equiv == 896
    # vLLM: 16 x ceil(16384 B state per layer / (16 x 128 B per token per layer)) = 128-token blocks
    layout = vllm_block_size(shape)
    bs, page = layout.block_size, layout.state_page_bytes
    assert (bs, page) == (128, 16384)

    hw = Hardware(GIB, gpu_util=1.0, reserve_bytes=0)
    wl = Workload(contexts=(4096.0,), env_fraction=0.75, shared_prefix=1024)
    p = plan(shape, hw, wl, EngineOptions(target_running=10_000))
    per_sample = (4096 - 1024 + 64) * 128 + 114_688  # unique KV + half block + one checkpoint
    shared = 1024 * 128 + 114_688

    def fits(n: int) -> bool:  # + one extra state copy per running request (states_per_running = 2)
        return n * per_sample + p99_running(n, 0.75) * 114_688 + shared <= GIB

    assert fits(p.n_mem) and not fits(p.n_mem + 1)
    assert p.n_mem == 1961  # worked by hand: 1961 -> 1,073,668,096 B <= 1 GiB; 1962 -> 1,074,298,880 B
    assert (p.reference_concurrency, p.binding) == (1961, "memory")
    m = p99_running(1961, 0.75)
    assert p.max_num_seqs == m == 535
    assert p.state_pool_bytes == (1961 + m + 1) * 114_688
    assert p.kv_pool_bytes == GIB - p.state_pool_bytes
    assert p.vllm_args["--block-size"] == 128
    assert p.vllm_args["--mamba-cache-mode"] == "align"
    assert p.vllm_args["--mamba-ssm-cache-dtype"] == "float32"  # lightning state kept in fp32, model is bf16
    # recompute at N_ref: the aligned-prefix tail only, half a 128-token block
    assert p.recompute_tokens_per_step == pytest.approx(64, abs=1)


def test_hybrid_sglang_settings_and_balance_point() -> None:
    shape = shape_from_config(HYBRID, weights_bytes=0)
    hw = Hardware(GIB, gpu_util=1.0, reserve_bytes=0)
    wl = Workload(contexts=(4096.0,), env_fraction=0.75, shared_prefix=1024)
    p = plan(shape, hw, wl, EngineOptions(target_running=10_000, sglang_slots_per_running=5))
    s = 114_688

    def fits(n: int) -> bool:  # SGLang: unpadded state, 1 checkpoint + 5 slots per running request
        return n * ((4096 - 1024) * 128 + s) + p99_running(n, 0.75) * 5 * s + 1024 * 128 + s <= GIB

    slots = p.sglang_args["--max-mamba-cache-size"]
    n = next(k for k in range(5000, 0, -1) if fits(k))
    m = p99_running(n, 0.75)
    assert slots == n + 5 * m + 1
    assert p.sglang_args["--max-running-requests"] == m
    assert p.sglang_args["--mamba-full-memory-ratio"] == pytest.approx(
        slots * s / (GIB - slots * s), abs=1e-4
    )
    r_star = next(r for r in p.rows if r.quantity == "SGLang balance point r*").value
    assert r_star == pytest.approx(5 * 896 / 4096)  # (S + D) x token_equiv / mean context
    assert any("r*" in line for line in p.comparison)
    # the split tuned for the agent workload holds more samples than r*'s
    at_rstar = next(r for r in p.rows if r.quantity == "samples cached at r*").value
    assert at_rstar < n


def test_recompute_grows_past_n_mem() -> None:
    shape = shape_from_config(HYBRID, weights_bytes=0)
    hw = Hardware(GIB, gpu_util=1.0, reserve_bytes=0)
    wl = Workload.from_stats(4096, 6000, env_fraction=0.75, shared_prefix=1024)
    p = plan(shape, hw, wl, EngineOptions(target_running=10_000), curve_points=(0.5, 1.0, 1.5, 2.0, 4.0))
    curve = sorted(p.recompute_curve, key=lambda c: c.concurrency)
    rates = [c.recompute_ratio for c in curve]
    assert rates == sorted(rates)
    assert rates[0] == pytest.approx(64 / wl.mean_context, rel=0.01)  # tail only
    assert curve[-1].evicted_fraction > 0.5  # 4 x N_ref: most waiting samples lose their cache


def test_spread_lowers_concurrency() -> None:
    shape = shape_from_config(DENSE, weights_bytes=GIB)
    hw = Hardware(11 * GIB, gpu_util=1.0, reserve_bytes=0)
    flat = plan(
        shape, hw, Workload.from_stats(10_000, None, env_fraction=0.5), EngineOptions(target_running=10**5)
    )
    wide = plan(
        shape, hw, Workload.from_stats(10_000, 25_000, env_fraction=0.5), EngineOptions(target_running=10**5)
    )
    assert wide.n_mem < flat.n_mem


def test_busy_batch_from_linear_cost() -> None:
    # t(B) = c0 + B (c_decode + c_attn ctx): 90 % of the asymptote at B = 9 c0 / (c_decode + c_attn ctx)
    cost = LinearCost(c0=0.01, c_prefill=0.0, c_decode=0.0001, c_attn=0.0)
    shape = shape_from_config(DENSE, weights_bytes=GIB)
    p = plan(
        shape,
        Hardware(11 * GIB, 1.0, 0),
        Workload(contexts=(1000.0,), env_fraction=0.5),
        EngineOptions(cost=cost),
    )
    assert p.n_busy == 2 * 900  # B_busy = 9 x 0.01 / 0.0001 = 900, over 1 - f = 0.5
    pick = reference_concurrency(
        kv_capacity_tokens=100_000,
        block_size=16,
        workload=Workload(contexts=(1000.0,), env_fraction=0.5),
        cost=cost,
    )
    assert pick.bounds["n_mem"] == 100_000 // 1008 == 99
    assert pick.n_ref == 99


def test_roofline_busy_batch_dense() -> None:
    # Llama-3-8B-like on an H200, 8k context: KV reads dominate, B_busy ~ 9 x weights / KV per sequence
    import json
    from importlib import resources

    cfg = json.loads(
        resources.files("agentbatch.planning.model_configs").joinpath("llama-3-8b.json").read_text()
    )
    shape = shape_from_config({k: v for k, v in cfg.items() if not k.startswith("_")})
    p = plan(shape, Hardware(141 * GIB), Workload(contexts=(8192.0,), env_fraction=0.0))
    kv_seq = 8192 * shape.kv_bytes_per_token
    assert p.n_busy == pytest.approx(9 * shape.weights_bytes / kv_seq, rel=0.1)


def test_reference_concurrency_state_slots() -> None:
    wl = Workload(contexts=(1000.0,), env_fraction=0.5)
    pick = reference_concurrency(
        kv_capacity_tokens=10**7, block_size=16, workload=wl, checkpoint_slots=64, target_running=10**4
    )
    assert pick.n_ref == pick.bounds["n_mem"] == 64  # one slot per admitted sample, states_per_running = 1


def test_plan_errors() -> None:
    shape = shape_from_config(DENSE, weights_bytes=20 * GIB)
    with pytest.raises(PlanError, match="no memory left for caches"):
        plan(shape, Hardware(11 * GIB), Workload(contexts=(1000.0,), env_fraction=0.5))
    with pytest.raises(PlanError, match="env_fraction"):
        Workload(contexts=(1000.0,), env_fraction=1.0)
    with pytest.raises(PlanError, match="p95"):
        Workload.from_stats(1000, 900, env_fraction=0.5)
    mamba = shape_from_config(
        {
            "model_type": "mamba2",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "state_size": 16,
            "num_heads": 2,
            "head_dim": 64,
        },
        weights_bytes=0,
    )
    with pytest.raises(PlanError, match="no attention layers"):
        plan(mamba, Hardware(8 * GIB), Workload(contexts=(1000.0,), env_fraction=0.5))


def test_lognormal_workload_matches_mean_and_p95() -> None:
    wl = Workload.from_stats(20_000, 40_000, env_fraction=0.3)
    assert wl.mean_context == pytest.approx(20_000)
    assert wl.quantile(0.95) == pytest.approx(40_000, rel=0.03)


def test_returning_evicted_lru_ages() -> None:
    from agentbatch.planning.resource_model import returning_evicted

    # no durations, or all equal (every waiting sample has the same age profile): the fraction itself
    assert returning_evicted(0.3, None) == 0.3
    # heavy tail: 9 waits of 1 s and one of 91 s. E[W] = 10; the long wait holds 91 % of waiting time.
    # evicting 50 % of waiting bytes hits only waits longer than tau with E[(W - tau)+] / 10 = 0.5,
    # i.e. tau = 86: only the long wait, 1 return in 10.
    waits = [1.0] * 9 + [91.0]
    assert returning_evicted(0.5, waits) == pytest.approx(0.1)
    # evicting everything: every return recomputes
    assert returning_evicted(1.0, waits) == 1.0
    assert returning_evicted(0.0, waits) == 0.0


def test_goodput_pick_passes_n_mem_when_recompute_is_cheap() -> None:
    dense = shape_from_config(DENSE, weights_bytes=GIB)
    hw = Hardware(11 * GIB, gpu_util=1.0, reserve_bytes=0)
    cheap = LinearCost(c0=0.01, c_prefill=1e-9, c_decode=1e-5, c_attn=0.0)
    dear = LinearCost(c0=0.01, c_prefill=1e-2, c_decode=1e-5, c_attn=0.0)
    wl = Workload.from_stats(10_000, 14_000, env_fraction=0.5, output_tokens=200, new_tokens=300)
    p_cheap = plan(dense, hw, wl, EngineOptions(cost=cheap))
    p_dear = plan(dense, hw, wl, EngineOptions(cost=dear))
    p_strict = plan(dense, hw, wl, EngineOptions(cost=cheap, allow_recompute=False))
    assert p_strict.reference_concurrency == p_strict.n_mem
    assert p_cheap.binding == "goodput" and p_cheap.reference_concurrency > p_cheap.n_mem
    assert p_dear.reference_concurrency == p_dear.n_mem  # recompute too dear to pass N_mem
