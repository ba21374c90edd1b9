"""The scheduling defaults, defined once: the batch config (`run`), `replay` (both modes), the
virtual-time config and `AdmissionLimits` all read them from here.

The defaults are the coordination policies (docs/ablation.md): decoupled admission, history-aware
CAAS for the environment queue (longest recorded chain first; plain CAAS, by observed progress,
for samples without history), trajectory-aware routing, chain-progress engine priority and
longest-recorded-chain-first admission when the store (or `--priors`) has history, with adaptive
admission control starting at the reference concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from agentbatch.scheduling.admission_order import AdmissionOrder

AdmissionControl = Literal["adaptive", "static"]
ADMISSION_CONTROLS: tuple[AdmissionControl, ...] = get_args(AdmissionControl)


@dataclass(frozen=True, slots=True)
class SchedulingDefaults:
    max_active_samples: int = 32  # samples admitted at once (the reference concurrency)
    env_slots: int = 8  # environment actions running at once
    per_worker_inflight: int = 16  # inference requests in flight per engine worker
    coupled: bool = False  # True = baseline: a sample holds an environment slot while admitted
    admission_order: AdmissionOrder = "longest_prior_first"
    env_queue: str = "caas_history"  # rank "total"; without priors it orders as plain "caas"
    inference_queue: str = "fifo"
    router: str = "trajectory_aware"
    priority: str = "chain_progress"
    # "adaptive": the admission limit starts at max_active_samples and follows measured pressure
    # (scheduling/admission_control.py); "static": it stays there
    admission_control: AdmissionControl = "adaptive"


DEFAULTS = SchedulingDefaults()
