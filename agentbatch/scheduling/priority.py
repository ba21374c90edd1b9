"""Per-request engine priority from chain progress (vLLM `--scheduling-policy priority`).

vLLM serves lower `priority` values first. Giving requests of samples that have advanced further a
lower value keeps long chains moving inside each worker, the inference-side half of CAAS.
"""

from __future__ import annotations

from agentbatch.scheduling.policies import PriorityPolicy
from agentbatch.scheduling.types import SampleProgress


class ChainProgressPriority(PriorityPolicy):
    """priority = max(0, ceiling - steps_done): more observed progress -> smaller value -> served first.

    With `use_prior` and a known `prior_chain_steps`, the expected *remaining* steps are used
    instead (longest remaining first: priority = ceiling - remaining is inverted, so a sample with
    more left to do gets the smaller value). Values stay non-negative integers, as vLLM expects.
    """

    def __init__(self, ceiling: int = 1000, use_prior: bool = False) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        self.ceiling = ceiling
        self.use_prior = use_prior

    def priority(self, sample: SampleProgress) -> int:
        if self.use_prior and sample.prior_chain_steps is not None:
            remaining = max(0.0, sample.prior_chain_steps - sample.steps_done)
            return max(0, self.ceiling - int(round(remaining)))
        return max(0, self.ceiling - sample.steps_done)
