"""Capacity planning: model shapes, the hybrid resource model, reference concurrency, engine flags.

A library (pure, no I/O beyond reading the files it is given): `plan(shape, hardware, workload)`
returns a `Plan` with the reasoning table and the vLLM / SGLang settings;
`reference_concurrency` / `concurrency_for_profile` give N_ref for an engine described by its pool
capacities (a simulated profile). The `agentbatch plan` command is a thin layer over it.

Imports: scheduling, traces.
"""

from agentbatch.planning.errors import InputError, PlanError
from agentbatch.planning.inputs import GIB, EngineOptions, Hardware, LinearCost
from agentbatch.planning.model_shape import ConfigError, ModelShape, shape_from_config
from agentbatch.planning.presets import load_model_shape, presets
from agentbatch.planning.reference import ConcurrencyPick, concurrency_for_profile, reference_concurrency
from agentbatch.planning.report import plan_document, render_plan
from agentbatch.planning.resource_model import BlockLayout, Plan, Row, plan, vllm_block_size
from agentbatch.planning.workload import Workload
from agentbatch.planning.workload_sources import (
    WorkloadSpec,
    load_workload,
    workload_from_csv,
    workload_from_trace,
)

__all__ = [
    "GIB",
    "BlockLayout",
    "ConcurrencyPick",
    "ConfigError",
    "EngineOptions",
    "Hardware",
    "InputError",
    "LinearCost",
    "ModelShape",
    "Plan",
    "PlanError",
    "Row",
    "Workload",
    "WorkloadSpec",
    "concurrency_for_profile",
    "load_model_shape",
    "load_workload",
    "plan",
    "plan_document",
    "presets",
    "reference_concurrency",
    "render_plan",
    "shape_from_config",
    "vllm_block_size",
    "workload_from_csv",
    "workload_from_trace",
]
