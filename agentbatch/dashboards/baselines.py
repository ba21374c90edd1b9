"""The strong baselines every printed comparison names, as virtual-time configs.

(a) "coupled, best limit": coupled admission (a sample holds an environment slot from admission to
    its end, like inspect_ai's max_sandboxes) with the admission limit a user would find by sweeping
    (S/4, S/2, S), session-affinity routing;
(b) "decoupled FIFO, all admitted": every sample admitted at once, one semaphore of S slots around
    the tools (FIFO), FIFO engine queues, session-affinity routing;
(c) "coupled at slots (paper)": the paper's baseline: coupled at the configured slots, FIFO,
    round-robin routing.
"Session affinity" is the trajectory-aware router (a sample's calls go back to the worker holding
its prefix unless that worker is overloaded). All run with a static admission limit and no priors. They are candidates of the policy portfolio
(agentbatch/scheduling/portfolio.py), defined there once.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentbatch.scheduling.portfolio import BUILTIN_CANDIDATES, COUPLED_BEST, COUPLED_PAPER, FIFO_ALL
from agentbatch.sim.portfolio import candidate_config
from agentbatch.sim.virtual_time import VirtualConfig

__all__ = ["COUPLED_BEST", "COUPLED_PAPER", "FIFO_ALL", "Baseline", "Comparison", "baselines", "compare",
           "coupled_limits"]


@dataclass(frozen=True)
class Baseline:
    name: str  # one of the three names above
    configs: list[VirtualConfig]  # one, or the sweep of (a): the best of them counts


def coupled_limits(env_slots: int) -> list[int]:
    """The coupled sweep's admission limits for `env_slots` (the portfolio's S/4, S/2, S)."""
    return sorted({c.admission_limit(samples=env_slots, env_slots=env_slots, n_ref=env_slots)
                   for c in BUILTIN_CANDIDATES if c.baseline == COUPLED_BEST})


def baselines(base: VirtualConfig, samples: int) -> list[Baseline]:
    """The three baselines for the hardware and slots of `base` (its workers, profile, env_slots):
    the baseline candidates of the portfolio (scheduling/portfolio.py), grouped."""
    out = []
    for group in (COUPLED_BEST, FIFO_ALL, COUPLED_PAPER):
        members = [c for c in BUILTIN_CANDIDATES if c.baseline == group]
        configs = [candidate_config(c, base, samples=samples, n_ref=base.max_active) for c in members]
        out.append(Baseline(group, configs))
    return out


@dataclass(frozen=True)
class Comparison:
    """A makespan against the best of the baselines, named."""

    makespan_s: float
    best_name: str
    best_s: float

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.best_s if self.best_s > 0 else float("inf")


def compare(makespan_s: float, baseline_makespans: dict[str, float]) -> Comparison:
    name = min(baseline_makespans, key=lambda k: (baseline_makespans[k], k))
    return Comparison(makespan_s, name, baseline_makespans[name])
