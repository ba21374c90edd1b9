"""What a plan is computed for, besides the model and the workload: the GPU and the engine's layout."""

from __future__ import annotations

from dataclasses import dataclass

from agentbatch.planning.errors import PlanError

GIB = 1 << 30


@dataclass(frozen=True)
class Hardware:
    """One GPU. Defaults: an H200 SXM (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s dense BF16).

    reserve_bytes: memory kept outside the caches for activations at max-num-batched-tokens, CUDA
      graphs and non-torch allocations (vLLM profiles it at start; 2-4 GiB is typical for one GPU).
    """

    gpu_mem_bytes: int
    gpu_util: float = 0.9
    reserve_bytes: int = 3 * GIB
    peak_flops: float = 989e12
    mem_bw: float = 4.8e12
    name: str = "GPU"

    def __post_init__(self) -> None:
        if not 0 < self.gpu_util <= 1:
            raise PlanError(f"gpu_util must be in (0, 1], got {self.gpu_util}")
        if self.gpu_mem_bytes <= 0:
            raise PlanError(f"gpu memory must be positive, got {self.gpu_mem_bytes}")


@dataclass(frozen=True)
class LinearCost:
    """An engine cost model: one iteration takes c0 + c_prefill x prefill tokens + c_decode x decode
    sequences + c_attn x attended context tokens (seconds); the simulated engine's form."""

    c0: float
    c_prefill: float
    c_decode: float
    c_attn: float

    def decode_step(self, batch: float, context: float) -> float:
        return self.c0 + batch * (self.c_decode + self.c_attn * context)


@dataclass(frozen=True)
class EngineOptions:
    """How the engines lay out memory; defaults follow vLLM (>= 0.11 hybrid manager) and SGLang.

    states_per_running: state copies a running request holds in vLLM (working state + the cached
      checkpoint it resumed from). sglang_slots_per_running: SGLang's S (extra_buffer = 5,
      extra_buffer_lazy = 4, no_buffer = 3, radix cache off = 1); sglang_draft_tokens: its D.
    busy_fraction: the share of asymptotic decode throughput that counts as "busy".
    target_running: give B_busy directly instead of deriving it.
    """

    block_size: int | None = None
    kernel_block_alignment: int = 16
    dense_block_size: int = 16
    states_per_running: int = 2
    sglang_slots_per_running: int = 5
    sglang_draft_tokens: int = 0
    busy_fraction: float = 0.9
    target_running: int | None = None
    safety_z: float = 1.645
    max_num_batched_tokens: int = 8192
    cost: LinearCost | None = None  # decode cost model for B_busy; None = roofline from Hardware
    allow_recompute: bool = True  # may N_ref pass N_mem where predicted goodput says so
    goodput_tolerance: float = 0.02
