"""Simulated inference engine: a pure model of one engine worker (`model`), its profiles and the
cost-model calibration. No I/O here: the real-time driver is `agentbatch.engines.sim_timing`,
the HTTP server `agentbatch.engines.sim_server`."""

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
