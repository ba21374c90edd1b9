"""`scheduling.policy`: which policy a live batch runs.

- "auto" (the default): before the batch, simulate every candidate of the policy portfolio
  (scheduling/portfolio.py, the strong baselines among them) in virtual time on the batch's own
  tasks as earlier batches in the store recorded them (one ensemble member per earlier batch, its
  recorded tool durations and token counts; the chain-length priors the batch runs with), on the
  configured engine workers, environment slots and admission limit (N_ref), and run the one the
  robust minimax rule picks (sim/portfolio.py `decide`). It needs an engine model: the engine config's
  simulated timing profile (`timing.profile`, `timing.time_scale`: the replay engine or a serve-sim
  pool described the same way). Without one, or without history of these tasks, the configured
  policy runs and the choice says why.
- "configured": the scheduling fields run as written.
- a candidate's name: that candidate.

The choice (each candidate's predicted makespans, the rule, the time spent deciding) is logged,
returned for the run's summary and published as a Prefect artifact (key `policy-choice`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agentbatch.flows.config import BatchConfig
from agentbatch.scheduling.portfolio import Candidate

log = logging.getLogger("agentbatch.policy")
HISTORY_BATCHES = 3  # earlier batches of the same tasks simulated at most (ensemble members)
NO_ENGINE_MODEL = "the engine config names no simulated timing profile to predict with"


@dataclass
class PolicyChoice:
    """What ran and why: `summary` is the run summary's `policy` section."""

    config: BatchConfig
    summary: dict[str, Any]
    plan: Any = None  # sim/replan_live.py LivePlan: what the run re-plans with (scheduling.replan), if it does


def choose_policy(config: BatchConfig, store: Any, batch_id: int, task_ids: list[str], workers: int,
                  priors: dict[str, float]) -> PolicyChoice:
    """The config the batch runs with, after `scheduling.policy` (module docstring)."""
    policy = config.scheduling.policy
    if policy != "auto":
        return _fixed(config, len(task_ids))
    why, members = _auto_inputs(config, store, batch_id, task_ids, priors)
    if why:
        return _not_chosen(config, f"batch {batch_id}", why)
    return _decide(config, members, workers, len(task_ids), f"batch {batch_id}")


def choose_gateway_policy(config: BatchConfig, store: Any, workers: int, *, harness: int | None = None,
                          expect: int | None = None) -> PolicyChoice:
    """A gateway batch's policy, as `choose_policy` with two differences. Its samples' task ids are
    not known before they arrive, so the ensemble is the suite's history: the latest finished batches
    of the same name (each one member, its completed samples). Its samples come as the harness sends
    them, so each candidate is simulated with the samples sent in their recorded order, `harness` open
    at once (`VirtualConfig.harness`; None: as many as those batches show, `harness_concurrency`).
    `expect`: the samples expected (an all-admitted candidate's limit), else the largest member's;
    the plan re-plans with the samples not yet arrived drawn from the first earlier batch."""
    if config.scheduling.policy != "auto":
        return _fixed(config, expect or config.scheduling.max_active_samples)
    label = f"gateway {config.name!r}"
    if engine_model(config) is None:
        return _not_chosen(config, label, NO_ENGINE_MODEL)
    from agentbatch.traces import chain_priors

    traces = named_history(store, config.name)
    if not traces:
        return _not_chosen(config, label, f"no earlier finished batch named {config.name!r} in the store")
    most = max(len(t.samples) for t in traces)
    window = harness or harness_concurrency(traces) or max(most, expect or 0)
    return _decide(config, _members(traces, chain_priors(*traces)), workers, expect or most, label, harness=window)


def _fixed(config: BatchConfig, samples: int) -> PolicyChoice:
    """`scheduling.policy` "configured" or a candidate's name."""
    policy = config.scheduling.policy
    if policy == "configured":
        return PolicyChoice(config, {"mode": "configured", "chosen": "configured"})
    from agentbatch.sim.portfolio import portfolio  # here: the simulator is a slow import

    cand = next(c for c in portfolio() if c.name == policy)
    return PolicyChoice(apply_candidate(config, cand, samples), {"mode": "named", "chosen": policy})


def _not_chosen(config: BatchConfig, label: str, why: str) -> PolicyChoice:
    log.info("%s: policy auto: %s; running the configured policy", label, why)
    return PolicyChoice(config, {"mode": "auto", "chosen": "configured", "reason": why})


def _decide(config: BatchConfig, members: list[Any], workers: int, samples: int, label: str, *,
            harness: int | None = None) -> PolicyChoice:
    from agentbatch.sim.portfolio import decide

    base = replace(engine_base(config, workers, [m.trace for m in members]), harness=harness)
    d = decide(members, base, n_ref=config.scheduling.max_active_samples)
    summary = d.to_dict()
    if harness is not None:
        summary["harness"] = harness
    log.info("%s: policy auto chose %r (score %.3f vs best baseline %r %.3f; %d simulation(s) on %d earlier "
             "run(s) in %.2fs)", label, d.choice.name, d.choice.score, d.choice.fallback, d.choice.fallback_score,
             d.simulations, d.members, d.decide_s)  # fmt: skip
    chosen = apply_candidate(config, d.chosen, samples)
    scheduling = chosen.scheduling.model_copy(update={"choice": summary})
    plan = live_plan(config, d, members, base, expected=None if harness is None else samples)
    return PolicyChoice(chosen.model_copy(update={"scheduling": scheduling}), summary, plan)


def live_plan(config: BatchConfig, d: Any, members: list[Any], base: Any, *, expected: int | None = None) -> Any:
    """What the run re-plans with (flows/replan.py), None when `scheduling.replan.every` is 0, the
    chosen candidate has no finite prediction, or fewer than MIN_MEMBERS earlier runs are known.
    `expected`: a gateway batch's samples (they arrive as the harness sends them)."""
    from agentbatch.sim.replan import MIN_MEMBERS, ReplanSettings
    from agentbatch.sim.replan_live import LivePlan

    r = config.scheduling.replan
    predicted = [x for x in d.predictions[d.choice.name] if math.isfinite(x)]
    if r.every <= 0 or not predicted:
        return None
    if len(members) < MIN_MEMBERS:
        log.info("policy auto: no re-planning while the batch runs: %d earlier run(s) of these tasks, it needs %d "
                 "(docs/method.md)", len(members), MIN_MEMBERS)
        return None
    every_s = r.every * statistics.median(predicted)
    return LivePlan(members, d.candidates, d.chosen, base, config.scheduling.max_active_samples, every_s,
                    ReplanSettings(every=r.every, margin=r.margin), expected)


def engine_model(config: BatchConfig) -> tuple[str, float] | None:
    """(profile, time scale) of the engine config's simulated timing, None when it names none."""
    timing = config.engine.params.get("timing")
    if isinstance(timing, dict) and timing.get("profile"):
        return str(timing["profile"]), float(timing.get("time_scale") or 1.0)
    return None


def engine_base(config: BatchConfig, workers: int, history: list[Any]) -> Any:
    """The virtual-time config the candidates are simulated on: the configured workers and slots, the
    engine model, and the runner's own costs per step and in starting chains as the earlier batches
    recorded them (at a compressed engine speed they are a large share of a step)."""
    from agentbatch.sim.virtual_time import VirtualConfig
    from agentbatch.sim.virtual_time.runner import with_runner_costs

    model = engine_model(config)
    assert model is not None
    profile, scale = model
    s = config.scheduling
    # recorded tool durations are wall seconds; the engine model runs in engine seconds
    base = VirtualConfig(workers=max(1, workers), profile=profile, env_slots=s.env_slots,
                         max_active=s.max_active_samples, env_time_scale=1.0 / scale)  # fmt: skip
    return with_runner_costs(base, history, scale)


def _auto_inputs(config: BatchConfig, store: Any, batch_id: int, task_ids: list[str],
                 priors: dict[str, float]) -> tuple[str | None, list[Any]]:
    """Why auto cannot choose (or None) and the ensemble it simulates."""
    if engine_model(config) is None:
        return NO_ENGINE_MODEL, []
    traces = history_traces(store, batch_id, set(task_ids))
    if not traces:
        return "no earlier batch in the store ran these tasks", []
    return None, _members(traces, priors)


def _members(traces: list[Any], priors: dict[str, float]) -> list[Any]:
    """One ensemble member per earlier batch, with the chain-length priors the batch runs with and
    the context priors of them all."""
    from agentbatch.sim.portfolio import Member  # here: the simulator is a slow import
    from agentbatch.sim.virtual_time.simulation import context_priors

    contexts = context_priors(*traces)
    return [Member(t, dict(priors) or None, contexts) for t in traces]


def history_traces(store: Any, batch_id: int, task_ids: set[str]) -> list[Any]:
    """The latest earlier finished batches that ran these tasks, as traces of those samples."""
    return _recent_traces(store, lambda row: row.id != batch_id, lambda s: s.task_id in task_ids)


def named_history(store: Any, name: str) -> list[Any]:
    """The latest earlier finished batches named `name` (a gateway's suite), as traces of their
    completed samples, oldest sample first (the order they arrived in)."""
    return _recent_traces(store, lambda row: row.name == name, lambda s: True)


def _recent_traces(store: Any, batch_ok: Callable[[Any], bool], sample_ok: Callable[[Any], bool]) -> list[Any]:
    """Up to HISTORY_BATCHES of the latest finished batches `batch_ok` accepts, newest first, as traces
    (without payloads) of their completed samples that `sample_ok` accepts (batches left with none
    are skipped)."""
    from agentbatch.db.models import BatchStatus
    from agentbatch.db.trace_io import RecordReader

    out: list[Any] = []
    finished = (BatchStatus.COMPLETED, BatchStatus.COMPLETED_WITH_FAILURES)
    for row in reversed(store.list_batches()):
        if len(out) >= HISTORY_BATCHES:
            break
        if row.status not in finished or not batch_ok(row):
            continue
        trace = RecordReader(store, row.id).read()  # what simulations read: no messages or observations
        trace.samples = [s for s in trace.samples if s.status == "completed" and sample_ok(s)]
        if trace.samples:
            out.append(trace)
    return out


def harness_concurrency(traces: list[Any]) -> int | None:
    """How many samples the harness kept open at once, as earlier batches show it: a batch whose most
    samples admitted and not yet finished at one time stayed below the admission limit it ran with
    shows the harness's number; one that reached its limit shows only that the harness sent at least
    that many. The largest of these where some batch shows the number; None (unknown) where none
    does, or a batch has no admission times."""
    shown: list[int] = []
    at_least: list[int] = []
    for trace in traces:
        spans = [(s.admitted_at, s.finished_at) for s in trace.samples]
        if not spans or any(a is None or f is None for a, f in spans):
            return None
        edges = sorted([(a, 1) for a, _ in spans] + [(f, -1) for _, f in spans])  # an end before a start at one time
        now = peak = 0
        for _, d in edges:
            now += d
            peak = max(peak, now)
        limit = ((trace.meta.get("config") or {}).get("scheduling") or {}).get("max_active_samples")
        (at_least if isinstance(limit, int) and peak >= limit else shown).append(peak)
    return max(shown + at_least) if shown else None


def apply_candidate(config: BatchConfig, c: Candidate, samples: int) -> BatchConfig:
    """The config with the candidate's scheduling (its limit rule on this batch; N_ref = the configured
    admission limit); baselines run without the priors, as in virtual time."""
    s = config.scheduling
    limit = c.admission_limit(samples=samples, env_slots=s.env_slots, n_ref=s.max_active_samples)
    update: dict[str, Any] = {
        "policy": c.name, "coupled": c.coupled, "max_active_samples": limit,
        "admission_order": c.admission_order, "admission_control": c.admission_control,
        "env_queue": s.env_queue.model_copy(update={"name": c.env_queue, "params": dict(c.env_queue_params)}),
        "inference_queue": s.inference_queue.model_copy(update={"name": c.inference_queue, "params": {}}),
        "router": s.router.model_copy(update={"name": c.router, "params": {}}),
        "priority": s.priority.model_copy(update={"name": c.priority, "params": {}}),
    }  # fmt: skip
    if not c.uses_priors:
        update["priors"] = {}
    return config.model_copy(update={"scheduling": s.model_copy(update=update)})


async def publish_choice(summary: dict[str, Any]) -> None:
    """The choice as a Prefect markdown artifact of the flow run (nothing outside a flow run)."""
    from prefect.artifacts import acreate_markdown_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None or summary.get("mode") != "auto":
        return
    await acreate_markdown_artifact(key="policy-choice", markdown=choice_markdown(summary),
                                    description="scheduling.policy: auto")


def choice_markdown(summary: dict[str, Any]) -> str:
    lines = [f"**policy auto** chose **{summary['chosen']}**"]
    if "reason" in summary:
        return lines[0] + f": {summary['reason']}"
    lines[0] += (f" (score {summary['score']}, best baseline {summary['fallback']} {summary['fallback_score']}; "
                 f"{summary['simulations']} simulations on {summary['members']} earlier run(s) in {summary['decide_s']} s)")
    lines += ["", f"Rule: {summary['rule']}.", "", "| candidate | baseline | predicted makespan (s) | score |",
              "|---|---|---|---|"]  # fmt: skip
    for r in summary["candidates"]:
        preds = ", ".join("cut" if p is None else f"{p:.1f}" for p in r["predicted_makespan_s"])
        lines.append(f"| {r['name']} | {r['baseline'] or ''} | {preds} | {r['score'] if r['score'] is not None else 'cut'} |")
    return "\n".join(lines)
