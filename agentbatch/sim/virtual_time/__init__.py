"""Virtual-time replay: a discrete-event simulation of a whole batch with the live policies (the
same scheduling core the live runner drives, the engine model of `agentbatch.sim`)."""

from agentbatch.scheduling.registry import PolicySpec
from agentbatch.sim.virtual_time.result import VirtualResult, VirtualSummary, simulate
from agentbatch.sim.virtual_time.simulation import VirtualBatch, VirtualConfig

__all__ = ["PolicySpec", "VirtualBatch", "VirtualConfig", "VirtualResult", "VirtualSummary", "simulate"]
