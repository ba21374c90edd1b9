"""Seeded synthetic workload families shaped like the paper's benchmarks.

Each family draws, per task, a base chain length, a tool-latency scale and a success probability;
per sample (one sample per task by default) it draws the noise around them, so two traces of the
same family, seed and tasks but different `epoch` are "the same benchmark rerun": history-aware
CAAS can use one as the prior of the other. Chains alternate inference and environment steps; each
inference prompt is the previous prompt + previous output + observation (prefix reuse), and the
first `system_tokens` of every prompt are shared by all samples of the same prefix group.

Distributions (lognormal = median * exp(sigma * N(0,1)), clipped to [min, max]) and capacities are
documented in docs/traces.md; `FamilySpec.capacities` are the constrained settings bench/ablation
uses (environment slots are the scarce resource).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from agentbatch.traces.schema import ENVIRONMENT, INFERENCE, Trace, TraceSample, TraceStep


@dataclass(frozen=True)
class Lognormal:
    median: float
    sigma: float
    lo: float
    hi: float

    def draw(self, rng: np.random.Generator, n: int | None = None, scale: float = 1.0) -> Any:
        x = self.median * scale * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(x, self.lo, self.hi)


@dataclass(frozen=True)
class FamilySpec:
    name: str
    description: str
    turns: Lognormal  # inference+environment pairs per sample (task base length)
    turn_noise_sigma: float  # per-sample multiplicative noise around the task's base length
    env_s: Lognormal  # environment step duration, seconds
    long_env_p: float  # share of environment steps that are long (test runs, page loads ...)
    long_env_s: Lognormal
    output_tokens: Lognormal
    obs_tokens: Lognormal
    system_tokens: int  # shared prefix per prefix group (system prompt + tool schemas)
    task_tokens: Lognormal  # the task's first user turn
    prefix_groups: int  # distinct shared prefixes (tool sets)
    max_context: int  # a sample stops when its context would exceed this
    success: tuple[float, float]  # Beta(a, b) of per-task success probability
    capacities: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, FamilySpec] = {
    "swe_like": FamilySpec(
        name="swe_like",
        description="SWE-bench-like: long heavy-tailed chains, sandbox commands of seconds, test runs of minutes",
        turns=Lognormal(18, 0.6, 4, 120),
        turn_noise_sigma=0.25,
        env_s=Lognormal(2.0, 0.9, 0.1, 60),
        long_env_p=0.08,
        long_env_s=Lognormal(40, 0.7, 10, 600),
        output_tokens=Lognormal(180, 0.6, 16, 2048),
        obs_tokens=Lognormal(350, 1.0, 8, 6000),
        system_tokens=2400,
        task_tokens=Lognormal(900, 0.5, 200, 4000),
        prefix_groups=1,
        max_context=64_000,
        success=(2.0, 3.0),
        capacities={"samples": 400, "workers": 2, "env_slots": 24, "max_active": 96, "profile": "llama3-8b-h100"},
    ),
    "widesearch_like": FamilySpec(
        name="widesearch_like",
        description="WideSearch-like: many tool calls (search, fetch) with network-like latency",
        turns=Lognormal(36, 0.5, 8, 150),
        turn_noise_sigma=0.2,
        env_s=Lognormal(1.2, 0.7, 0.15, 20),
        long_env_p=0.03,
        long_env_s=Lognormal(8, 0.5, 3, 60),
        output_tokens=Lognormal(90, 0.5, 12, 1024),
        obs_tokens=Lognormal(700, 0.8, 30, 8000),
        system_tokens=1800,
        task_tokens=Lognormal(300, 0.4, 80, 1500),
        prefix_groups=1,
        max_context=96_000,
        success=(1.5, 4.0),
        capacities={"samples": 300, "workers": 2, "env_slots": 16, "max_active": 96, "profile": "ling-flash-2.0-h200"},
    ),
    "mcp_like": FamilySpec(
        name="mcp_like",
        description="MCP-Atlas-like: moderate chains over rate-limited MCP tool servers",
        turns=Lognormal(10, 0.45, 3, 40),
        turn_noise_sigma=0.2,
        env_s=Lognormal(0.6, 0.8, 0.05, 15),
        long_env_p=0.05,
        long_env_s=Lognormal(5, 0.5, 2, 30),
        output_tokens=Lognormal(120, 0.5, 12, 1024),
        obs_tokens=Lognormal(400, 0.9, 10, 5000),
        system_tokens=3000,
        task_tokens=Lognormal(250, 0.4, 60, 1200),
        prefix_groups=6,
        max_context=48_000,
        success=(2.5, 2.5),
        capacities={"samples": 400, "workers": 2, "env_slots": 8, "max_active": 64, "profile": "llama3-8b-h100"},
    ),
    "bfcl_like": FamilySpec(
        name="bfcl_like",
        description="BFCL-multi-turn-like: short chains, fast deterministic tools",
        turns=Lognormal(4, 0.45, 1, 14),
        turn_noise_sigma=0.15,
        env_s=Lognormal(0.02, 0.8, 0.001, 0.5),
        long_env_p=0.0,
        long_env_s=Lognormal(0.1, 0.1, 0.05, 0.5),
        output_tokens=Lognormal(45, 0.5, 6, 400),
        obs_tokens=Lognormal(50, 1.0, 4, 3000),
        system_tokens=2600,
        task_tokens=Lognormal(120, 0.4, 30, 600),
        prefix_groups=8,
        max_context=32_000,
        success=(3.0, 2.0),
        capacities={"samples": 800, "workers": 2, "env_slots": 8, "max_active": 256, "profile": "llama3-8b-h100"},
    ),
}


def get_family(name: str) -> FamilySpec:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown workload family {name!r}; expected one of {sorted(FAMILIES)}") from None


@dataclass(frozen=True)
class _TaskParams:
    """Task-level draws, independent of the epoch."""

    base_turns: float
    env_scale: float  # environment latency scale
    success_p: float
    group: int  # prefix group
    task_tokens: int


def _task_params(spec: FamilySpec, seed: int, task: int) -> _TaskParams:
    rng = np.random.default_rng([seed, task, 0])
    base_turns = float(spec.turns.draw(rng))
    env_scale = float(np.exp(0.3 * rng.standard_normal()))
    p = float(rng.beta(*spec.success))
    group = int(rng.integers(spec.prefix_groups))
    task_tokens = int(spec.task_tokens.draw(rng))
    return _TaskParams(base_turns, env_scale, p, group, task_tokens)


def _steps(spec: FamilySpec, turns: int, outs: np.ndarray, obs: np.ndarray, env: np.ndarray,
           context: int) -> list[TraceStep]:
    """Alternating inference and environment steps until the chain ends or the context is full."""
    steps: list[TraceStep] = []
    for j in range(turns):
        o = int(outs[j])
        last = j == turns - 1 or context + o + int(obs[j]) + int(outs[j]) > spec.max_context
        steps.append(TraceStep(index=len(steps), kind=INFERENCE, duration_s=0.0, prompt_tokens=context, output_tokens=o))
        ob = 0 if last else int(obs[j])
        steps.append(
            TraceStep(
                index=len(steps), kind=ENVIRONMENT, duration_s=float(env[j]), obs_tokens=ob, tool_calls=0 if last else 1, done=last
            )
        )
        context += o + ob
        if last:
            break
    return steps


def _sample(spec: FamilySpec, seed: int, i: int, t: int, epoch: int, turns_scale: float) -> TraceSample:
    tp = _task_params(spec, seed, t)
    rng = np.random.default_rng([seed, t, 1 + epoch, i])
    turns = tp.base_turns * turns_scale * math.exp(spec.turn_noise_sigma * rng.standard_normal())
    turns = int(np.clip(round(turns), spec.turns.lo, spec.turns.hi * max(1.0, turns_scale)))
    outs = spec.output_tokens.draw(rng, turns).astype(int)
    obs = spec.obs_tokens.draw(rng, turns).astype(int)
    env = spec.env_s.draw(rng, turns, scale=tp.env_scale)
    if spec.long_env_p > 0:
        long = rng.random(turns) < spec.long_env_p
        env = np.where(long, spec.long_env_s.draw(rng, turns, scale=tp.env_scale), env)
    score = float(rng.random() < tp.success_p)
    return TraceSample(
        index=i,
        task_id=f"{spec.name}/{t:05d}",
        steps=_steps(spec, turns, outs, obs, env, spec.system_tokens + tp.task_tokens),
        task={"family": spec.name, "task": t},
        score=score,
        result={"score": score},
        prefix_group=f"{spec.name}/g{tp.group}",
        shared_prefix_tokens=spec.system_tokens,
    )


def generate(
    family: str | FamilySpec,
    samples: int | None = None,
    seed: int = 0,
    *,
    tasks: int | None = None,
    epoch: int = 0,
    turns_scale: float = 1.0,
) -> Trace:
    """Generate a trace of `samples` samples over `tasks` task ids (default: one task per sample).

    epoch: a rerun of the same tasks (different per-sample noise, same task-level parameters).
    turns_scale: stretch every chain (e.g. to force ~30 steps per sample for speed benches).
    """
    spec = get_family(family) if isinstance(family, str) else family
    n = int(samples if samples is not None else spec.capacities.get("samples", 100))
    n_tasks = int(tasks or n)
    out = [_sample(spec, seed, i, i % n_tasks, epoch, turns_scale) for i in range(n)]
    meta: dict[str, Any] = {
        "source": "synthetic",
        "family": spec.name,
        "seed": seed,
        "epoch": epoch,
        "tasks": n_tasks,
        "turns_scale": turns_scale,
        "spec": asdict(spec),
    }
    return Trace(samples=out, meta=json.loads(json.dumps(meta)))  # JSON-normal, as after a round trip
