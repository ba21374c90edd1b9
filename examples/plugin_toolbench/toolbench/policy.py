"""The "toolbench_fewest_steps" priority policy: the sample with the fewest steps done goes first
(least attained service, the opposite of agentbatch's chain-progress default; for comparisons)."""

from __future__ import annotations

from agentbatch.scheduling.policies import PriorityPolicy
from agentbatch.scheduling.types import SampleProgress


class FewestStepsFirst(PriorityPolicy):
    def __init__(self, ceiling: int = 1000) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        self.ceiling = ceiling

    def priority(self, sample: SampleProgress) -> int | None:
        return min(sample.steps_done, self.ceiling)
