"""Traces: batches as files (Parquet), synthetic workload families, history priors.

Imports: protocols.
"""

from agentbatch.traces.generators import FAMILIES, FamilySpec, generate, get_family
from agentbatch.traces.parquet import read_trace, write_trace
from agentbatch.traces.schema import Trace, TraceSample, TraceStep, chain_priors

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "Trace",
    "TraceSample",
    "TraceStep",
    "chain_priors",
    "generate",
    "get_family",
    "read_trace",
    "write_trace",
]
