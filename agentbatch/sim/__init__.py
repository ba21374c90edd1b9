"""Simulated inference engine: a pure model of one engine worker and what drives it.

`model.EngineModel` is the step logic; it keeps its waiting queue (`request_queue`), KV block pool
and prefix tree (`block_pool`), recurrent-state pool (`state_pool`) and prompt hashes
(`prompt_hashes`) apart, talking through the dataclasses of `requests`. `profiles` holds the
hardware/model profiles, `calibrate` fits their cost model to measured timings, `drive` runs a
model to completion, `virtual_time` replays whole batches in virtual time. No I/O here: the
real-time driver is `agentbatch.engines.sim_timing`, the HTTP server `agentbatch.engines.sim_server`.

Imports: scheduling, planning, traces, protocols.
"""

from agentbatch.sim.model import EngineModel, IterationResult, RequestStats, SimRequest
from agentbatch.sim.profiles import PROFILES, CostModel, EngineProfile, get_profile

__all__ = [
    "PROFILES",
    "CostModel",
    "EngineModel",
    "EngineProfile",
    "IterationResult",
    "RequestStats",
    "SimRequest",
    "get_profile",
]
