"""Run a virtual replay and summarise it: makespan beside its lower bound, cache reuse, tail latency.

`steps_frame()` / `samples_frame()` have the store's column names (dashboards/frames.py), with
sample ids = trace sample indices and times in virtual seconds from the batch start, so the same
analytics apply to simulated and live batches.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from agentbatch.scheduling.lower_bound import LowerBound
from agentbatch.sim.virtual_time.bounds import trace_lower_bound
from agentbatch.sim.virtual_time.simulation import (
    SAMPLE_FIELDS,
    STEP_FIELDS,
    EngineFactory,
    RawResult,
    VirtualBatch,
    VirtualConfig,
)
from agentbatch.traces.schema import Trace


@dataclass
class VirtualSummary:
    makespan_s: float
    lower_bound_s: float
    lb_binding: str
    lb_ratio: float
    lb_terms: dict[str, float]
    cache_hit_rate: float  # cached prompt tokens / prompt tokens
    prompt_tokens: int
    cached_prompt_tokens: int
    recomputed_tokens: int
    preemptions: int
    p50_latency_s: float  # sample latency: admission to finish
    p99_latency_s: float
    mean_score: float
    samples: int
    steps: int
    events: int
    sim_wall_s: float
    router: dict[str, int] = field(default_factory=dict)
    aged_pops: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VirtualResult:
    config: VirtualConfig
    raw: RawResult
    lower_bound: LowerBound
    summary: VirtualSummary

    def steps_frame(self) -> pd.DataFrame:
        df = pd.DataFrame.from_records(self.raw.steps, columns=list(STEP_FIELDS))
        df.insert(0, "id", np.arange(1, len(df) + 1))
        df["status"] = "completed"
        df["attempt"] = 1
        df["tool_calls"] = np.nan
        return df

    def samples_frame(self) -> pd.DataFrame:
        df = pd.DataFrame.from_records(self.raw.samples, columns=list(SAMPLE_FIELDS))
        df.insert(0, "id", df["index"])
        df["status"] = "completed"
        df["error"] = None
        df["task_group"] = None  # synthetic and recorded traces carry no task groups
        return df


def simulate(trace: Trace, config: VirtualConfig, engine_factory: EngineFactory | None = None) -> VirtualResult:
    start = time.perf_counter()
    batch = VirtualBatch(trace, config, engine_factory)
    raw = batch.run()
    wall = time.perf_counter() - start
    lb = trace_lower_bound(trace, batch.profile, config.workers, config.env_slots, config.env_time_scale)
    prompt = cached = recomputed = preempt = 0
    for row in raw.steps:
        if row[7] is not None:
            prompt += row[7]
            cached += row[8]
            recomputed += row[9]
            preempt += row[14] or 0
    lat = np.array([r[5] - r[4] for r in raw.samples], dtype=float)
    scores = [r[3] for r in raw.samples if r[3] is not None]
    summary = VirtualSummary(
        makespan_s=raw.makespan_s,
        lower_bound_s=lb.value,
        lb_binding=lb.binding,
        lb_ratio=lb.ratio(raw.makespan_s),
        lb_terms={"chain": lb.longest_chain_s, "inference": lb.inference_bound_s, "environment": lb.environment_bound_s},
        cache_hit_rate=cached / prompt if prompt else 0.0,
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        recomputed_tokens=recomputed,
        preemptions=preempt,
        p50_latency_s=float(np.percentile(lat, 50)) if len(lat) else 0.0,
        p99_latency_s=float(np.percentile(lat, 99)) if len(lat) else 0.0,
        mean_score=float(np.mean(scores)) if scores else 0.0,
        samples=len(raw.samples),
        steps=len(raw.steps),
        events=raw.events,
        sim_wall_s=wall,
        router=raw.router_counters,
        aged_pops=raw.aged_pops,
    )
    return VirtualResult(config=config, raw=raw, lower_bound=lb, summary=summary)
