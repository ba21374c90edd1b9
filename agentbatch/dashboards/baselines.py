"""The strong baselines every printed comparison names, as virtual-time configs.

(a) "coupled, best limit": coupled admission (a sample holds an environment slot from admission to
    its end, like inspect_ai's max_sandboxes) with the admission limit a user would find by sweeping
    (S/4, S/2, S), session-affinity routing;
(b) "decoupled FIFO, all admitted": every sample admitted at once, one semaphore of S slots around
    the tools (FIFO), FIFO engine queues, session-affinity routing;
(c) "coupled at slots (paper)": the paper's baseline: coupled at the configured slots, FIFO,
    round-robin routing.
"Session affinity" is the trajectory-aware router (a sample's calls go back to the worker holding
its prefix unless that worker is overloaded). All run with a static admission limit and no priors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig

COUPLED_BEST = "coupled, best limit"
FIFO_ALL = "decoupled FIFO, all admitted"
COUPLED_PAPER = "coupled at slots (paper)"


@dataclass(frozen=True)
class Baseline:
    name: str  # one of the three names above
    configs: list[VirtualConfig]  # one, or the sweep of (a): the best of them counts


def coupled_limits(env_slots: int) -> list[int]:
    return sorted({max(1, env_slots // 4), max(1, env_slots // 2), env_slots})


def baselines(base: VirtualConfig, samples: int) -> list[Baseline]:
    """The three baselines for the hardware and slots of `base` (its workers, profile, env_slots)."""
    paper = replace(base, coupled=True, max_active=base.env_slots, per_worker_inflight=None,
                    router=PolicySpec("round_robin"), env_queue=PolicySpec("fifo"),
                    inference_queue=PolicySpec("fifo"), priority=PolicySpec("fcfs"), priors=None,
                    admission_order="arrival", admission_control="static")  # fmt: skip
    affinity = replace(paper, router=PolicySpec("trajectory_aware"))
    sweep = [replace(affinity, max_active=n) for n in coupled_limits(base.env_slots)]
    fifo_all = replace(affinity, coupled=False, max_active=max(1, samples))
    return [Baseline(COUPLED_BEST, sweep), Baseline(FIFO_ALL, [fifo_all]), Baseline(COUPLED_PAPER, [paper])]


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
