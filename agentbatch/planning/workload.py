"""The agent workload as memory and concurrency see it: context lengths, environment share, prefixes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentbatch.planning.errors import PlanError


@dataclass(frozen=True)
class Workload:
    """The agent workload, as far as memory and concurrency care.

    contexts: context lengths (tokens, including the shared prefix) of samples at random moments of
      their life, e.g. every inference step's prompt + output tokens from a trace; their mean and
      spread drive the memory demand.
    env_fraction: share of a sample's time spent waiting on the environment (0..1).
    shared_prefix: tokens every sample's prompt starts with (system prompt, tool schemas).
    peak_context: the longest context any sample reaches (sets --max-model-len).
    num_samples: the batch size, an upper bound on concurrency when known.
    """

    contexts: tuple[float, ...]
    env_fraction: float
    shared_prefix: int = 0
    peak_context: int | None = None
    num_samples: int | None = None
    source: str = "given"
    weights: tuple[float, ...] | None = None  # time each context is held (None = equal)
    output_tokens: float | None = None  # mean output tokens per inference step (for the goodput pick)
    new_tokens: float | None = None  # mean prompt tokens per step not in the previous context (observations)
    prefix_groups: int = 1  # distinct shared prefixes (tool sets), each stored once
    env_durations: tuple[float, ...] | None = None  # environment step durations (seconds), for LRU ages

    def __post_init__(self) -> None:
        if not self.contexts:
            raise PlanError("workload: no context lengths given")
        if any(c <= 0 or not math.isfinite(c) for c in self.contexts):
            raise PlanError("workload: context lengths must be positive numbers")
        if self.weights is not None and (
            len(self.weights) != len(self.contexts)
            or any(w < 0 for w in self.weights)
            or sum(self.weights) <= 0
        ):
            raise PlanError("workload: weights must be one non-negative number per context, not all zero")
        if not 0 <= self.env_fraction < 1:
            raise PlanError(f"workload: env_fraction must be in [0, 1), got {self.env_fraction}")
        if self.shared_prefix < 0 or self.shared_prefix > self.mean_context:
            raise PlanError(
                f"workload: shared_prefix {self.shared_prefix} must be between 0 and the mean context "
                f"{self.mean_context:.0f} (contexts include the shared prefix)"
            )

    @property
    def mean_context(self) -> float:
        return float(np.average(self.contexts, weights=self.weights))

    @property
    def std_context(self) -> float:
        mu = self.mean_context
        return float(math.sqrt(np.average((np.asarray(self.contexts) - mu) ** 2, weights=self.weights)))

    def quantile(self, q: float) -> float:
        x = np.asarray(self.contexts, dtype=float)
        if self.weights is None:
            return float(np.quantile(x, q))
        order = np.argsort(x)
        cum = np.cumsum(np.asarray(self.weights, dtype=float)[order])
        return float(x[order][min(len(x) - 1, int(np.searchsorted(cum, q * cum[-1])))])

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_stats(
        cls,
        mean_context: float,
        p95_context: float | None = None,
        *,
        env_fraction: float,
        shared_prefix: int = 0,
        peak_context: int | None = None,
        num_samples: int | None = None,
        output_tokens: float | None = None,
        new_tokens: float | None = None,
        points: int = 201,
    ) -> Workload:
        """A lognormal context distribution with the given mean and 95th percentile.

        Solves ln p95 = m + 1.645 s and ln mean = m + s^2 / 2 for (m, s) and takes `points` evenly
        spaced quantiles (deterministic, no sampling). Without p95 all samples have the mean context.
        """
        if mean_context <= 0:
            raise PlanError(f"mean context must be positive, got {mean_context}")
        if p95_context is None or p95_context == mean_context:
            contexts: tuple[float, ...] = (float(mean_context),)
        else:
            ratio = math.log(p95_context / mean_context) if p95_context > 0 else -1
            z = 1.6448536269514722
            if ratio <= 0 or ratio >= z * z / 2:
                raise PlanError(
                    f"p95 context {p95_context} must lie between the mean {mean_context} and "
                    f"{mean_context * math.exp(z * z / 2):.0f} (3.87 x mean) for a lognormal fit"
                )
            s = z - math.sqrt(z * z - 2 * ratio)
            m = math.log(mean_context) - s * s / 2
            qs = (np.arange(points) + 0.5) / points
            from statistics import NormalDist

            zs = np.array([NormalDist().inv_cdf(float(q)) for q in qs])
            draws = np.exp(m + s * zs)
            draws *= mean_context / draws.mean()  # exact mean despite the discretisation
            contexts = tuple(float(x) for x in draws)
        return cls(
            contexts=contexts,
            env_fraction=env_fraction,
            shared_prefix=shared_prefix,
            peak_context=peak_context,
            num_samples=num_samples,
            source=f"given: mean {mean_context:g}, p95 {p95_context}",
            output_tokens=output_tokens,
            new_tokens=new_tokens,
        )
