"""Per-request engine priority from chain progress (vLLM `--scheduling-policy priority`).

vLLM serves lower `priority` values first. Giving requests of samples that have advanced further a
lower value keeps long chains moving inside each worker, the inference-side half of CAAS.
"""

from __future__ import annotations

from agentbatch.scheduling.policies import PriorityPolicy
from agentbatch.scheduling.types import SampleProgress


class ChainProgressPriority(PriorityPolicy):
    """priority = max(0, ceiling - steps_done): more observed progress -> smaller value -> served first.

    With `use_prior` and a known `prior_chain_steps` (the task's chain length in earlier batches),
    the expected chain length ranks instead: rank="total" (default) gives longer expected chains the
    smaller value (static, like the history-aware CAAS queue), rank="remaining" the expected steps
    still to go. Values stay non-negative integers, as vLLM expects.
    """

    def __init__(self, ceiling: int = 1000, use_prior: bool = False, rank: str = "total") -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        if rank not in ("total", "remaining"):
            raise ValueError(f"rank must be 'total' or 'remaining', got {rank!r}")
        self.ceiling = ceiling
        self.use_prior = use_prior
        self.rank = rank

    def priority(self, sample: SampleProgress) -> int:
        if self.use_prior and sample.prior_chain_steps is not None:
            expected = sample.prior_chain_steps
            if self.rank == "remaining":
                expected = max(0.0, expected - sample.steps_done)
            return max(0, self.ceiling - int(round(expected)))
        return max(0, self.ceiling - sample.steps_done)
