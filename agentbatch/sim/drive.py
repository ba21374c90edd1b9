"""Drive one EngineModel over a fixed list of timed arrivals, in virtual time (no sleeping).

For tests, benchmarks and calibration checks; the batch replay has its own event loop because its
arrivals depend on earlier completions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agentbatch.sim.model import EngineModel, RequestStats, SimRequest
from agentbatch.sim.profiles import EngineProfile


@dataclass
class DriveResult:
    stats: list[RequestStats]  # in finishing order
    makespan: float
    iterations: int
    metrics: dict[str, float] = field(default_factory=dict)

    def by_id(self) -> dict[str, RequestStats]:
        return {s.request_id: s for s in self.stats}


def drive(
    engine: EngineModel | EngineProfile,
    arrivals: Iterable[tuple[float, SimRequest]],
    *,
    policy: str = "fcfs",
    max_iterations: int = 10_000_000,
) -> DriveResult:
    """Feed each request at its arrival time and run iterations until all are done."""
    model = engine if isinstance(engine, EngineModel) else EngineModel(engine, policy=policy)
    pending = sorted(arrivals, key=lambda a: a[0])
    i = 0
    now = pending[0][0] if pending else 0.0
    stats: list[RequestStats] = []
    iterations = 0
    while i < len(pending) or model.has_work():
        while i < len(pending) and pending[i][0] <= now:
            model.add_request(pending[i][1], now)
            i += 1
        if not model.has_work():
            now = pending[i][0]  # idle until the next arrival
            continue
        result = model.run_iteration(now)
        now += result.duration
        stats.extend(result.finished)
        iterations += 1
        if iterations > max_iterations:
            raise RuntimeError(f"no completion after {max_iterations} iterations")
    return DriveResult(stats=stats, makespan=now, iterations=iterations, metrics=model.metrics())
