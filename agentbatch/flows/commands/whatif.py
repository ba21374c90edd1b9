"""`agentbatch whatif BATCH`: replay a finished batch in virtual time with other capacities or another
policy, and print the predicted makespan beside the recorded one.

The batch's recorded steps (environment durations as they ran, inference token counts) are
replayed on the simulated engine model (docs/sim-engine.md) with the batch's own scheduling config,
first unchanged (how far virtual time is from what was recorded: the prediction's own error), then
with the changes asked for: `--env-slots N`, `--workers N`, `--policy NAME` (a candidate of the
policy portfolio, docs/method.md; `--policy list` names them). The change's effect is the ratio of
the two predictions, so the model's error on this batch cancels out to first order.

The live runner spends time of its own on every step (the HTTP round trip and tokenizing of a call,
the store's commit, the gap until the sample's next step is queued) and in starting the sample
chains; on a busy machine that is a large share of a short batch. Both are measured from the
recorded steps and replayed: the time an inference call took beyond the engine's own prefill,
decode and queue, plus the gap until the sample's next step is queued, averaged over all steps
(`VirtualConfig.step_latency_s`); the batch's start-up until its first chain starts (added to the
prediction), the spacing of the first steps of the samples admitted at the start
(`sample_start_s`) and, for a sample admitted later, the time from its admission to its first step
(`sample_start_latency_s`), so the prediction models the runner that recorded the batch.

The engine model needs the workers' profile and speed: `--profile` and `--time-scale` (the speed
`serve-sim --time-scale` or the replay engine ran at: 0.1 = ten times faster than real time); by
default those of the batch's engine config when it names them (the replay engine's simulated
timing), else llama3-8b-h100 at real time.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import Any

from agentbatch.flows.commands._common import (
    DEFAULT_PROFILE,
    EXIT_USAGE,
    add_db_option,
    fail,
    quiet_on_closed_pipe,
)
from agentbatch.flows.commands._inputs import positive_float, positive_int

POLICY_KINDS = ("router", "env_queue", "inference_queue", "priority")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("whatif", help="replay a finished batch in virtual time with other slots, workers or policy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch_id", type=int, help="batch id (a finished batch in the store)")
    p.add_argument("--env-slots", type=positive_int, default=None, help="environment slots instead of the batch's")
    p.add_argument("--workers", type=positive_int, default=None, help="engine workers instead of the batch's")
    p.add_argument("--policy", default=None, metavar="NAME",
                   help="a candidate of the policy portfolio instead of the batch's scheduling ('list' names them)")
    p.add_argument("--profile", default=None, help="the engine workers' profile (default: the batch's, else "
                   f"{DEFAULT_PROFILE})")
    p.add_argument("--time-scale", type=positive_float, default=None,
                   help="the speed the workers ran at, as serve-sim --time-scale (default: the batch's, else 1)")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(run))


@dataclass
class Recorded:
    """What the store holds of the batch: its trace, scheduling config, engine and makespan."""

    trace: Any
    scheduling: dict[str, Any]
    engine: dict[str, Any]
    workers: int
    makespan_s: float


def run(args: argparse.Namespace) -> int:
    from agentbatch.sim.portfolio import portfolio

    if args.policy == "list":
        print("\n".join(c.name for c in portfolio()))
        return 0
    if args.policy is not None and args.policy not in {c.name for c in portfolio()}:
        return fail(f"whatif: --policy {args.policy!r} is not in the portfolio; `--policy list` names them")
    from agentbatch.flows.commands.status import open_store_or_explain

    store = open_store_or_explain(args.db, "whatif")
    if store is None:
        return EXIT_USAGE
    try:
        rec = load(store, args.batch_id)
    except ValueError as exc:
        return fail(f"whatif: {exc}")
    finally:
        store.close()
    try:
        out = predict(rec, args)
    except (ValueError, KeyError) as exc:
        return fail(f"whatif: batch {args.batch_id}: {exc}")
    print(json.dumps(out, indent=2) if args.json else text(args.batch_id, out))
    return 0


def load(store: Any, batch_id: int) -> Recorded:
    from agentbatch.db.trace_io import export_batch
    from agentbatch.protocols.secrets import from_stored

    row = store.get_batch(batch_id)
    if row is None:
        raise ValueError(f"no batch {batch_id} in {store.url}")
    samples = store.samples(batch_id)
    done = [s for s in samples if s.finished_at is not None and s.admitted_at is not None]
    if not done or len(done) < len(samples):
        raise ValueError(f"batch {batch_id} has {len(samples) - len(done)} of {len(samples)} samples unfinished; "
                         "whatif replays a finished batch")
    config = from_stored(row.config)
    trace = export_batch(store, batch_id)
    makespan = max(s.finished_at for s in done) - min(s.admitted_at for s in done)
    return Recorded(trace, dict(config.get("scheduling") or {}), dict(config.get("engine") or {}),
                    _engine_workers(trace), makespan)  # fmt: skip


def _engine_workers(trace: Any) -> int:
    """The engine workers that served the batch: those its inference steps name."""
    return len({st.worker for s in trace.samples for st in s.steps if st.kind == "inference" and st.worker})


def _engine_speed(rec: Recorded, args: argparse.Namespace) -> tuple[str, float]:
    timing = (rec.engine.get("params") or {}).get("timing") or {}
    profile = args.profile or timing.get("profile") or DEFAULT_PROFILE
    scale = args.time_scale or float(timing.get("time_scale") or 1.0)
    return profile, scale


def base_config(rec: Recorded, args: argparse.Namespace) -> Any:
    """The virtual-time config of the batch as it ran (engine seconds: environment durations / scale)."""
    from agentbatch.scheduling.defaults import DEFAULTS
    from agentbatch.scheduling.registry import PolicySpec
    from agentbatch.sim.virtual_time import VirtualConfig
    from agentbatch.sim.virtual_time.runner import with_runner_costs

    s, (profile, scale) = rec.scheduling, _engine_speed(rec, args)
    workers = rec.workers or int((rec.engine.get("params") or {}).get("workers") or 1)
    policies = {k: PolicySpec((s.get(k) or {}).get("name", getattr(DEFAULTS, k)), dict((s.get(k) or {}).get("params") or {}))
                for k in POLICY_KINDS}  # fmt: skip
    cfg = VirtualConfig(
        workers=workers, profile=profile, env_time_scale=1.0 / scale,
        max_active=int(s.get("max_active_samples", DEFAULTS.max_active_samples)),
        env_slots=int(s.get("env_slots", DEFAULTS.env_slots)),
        per_worker_inflight=int(s.get("per_worker_inflight", DEFAULTS.per_worker_inflight)),
        coupled=bool(s.get("coupled", DEFAULTS.coupled)), admission_order=s.get("admission_order", DEFAULTS.admission_order),
        admission_control=s.get("admission_control", DEFAULTS.admission_control), priors=s.get("priors") or None,
        router=policies["router"], env_queue=policies["env_queue"], inference_queue=policies["inference_queue"],
        priority=policies["priority"],
    )  # fmt: skip
    return with_runner_costs(cfg, [rec.trace], scale)


def predict(rec: Recorded, args: argparse.Namespace) -> dict[str, Any]:
    """The recorded makespan, the prediction of the same config and of the changed one (wall seconds)."""
    from agentbatch.sim.portfolio import candidate_config, portfolio
    from agentbatch.sim.virtual_time import simulate
    from agentbatch.sim.virtual_time.runner import runner_cost, start_costs

    _, scale = _engine_speed(rec, args)
    start = start_costs(rec.trace)
    same = base_config(rec, args)
    changed = same
    what: list[str] = []
    if args.env_slots is not None:
        changed, what = replace(changed, env_slots=args.env_slots), [*what, f"{args.env_slots} environment slots"]
    if args.workers is not None:
        changed, what = replace(changed, workers=args.workers), [*what, f"{args.workers} engine workers"]
    if args.policy is not None:
        cand = next(c for c in portfolio() if c.name == args.policy)
        changed = candidate_config(cand, changed, samples=len(rec.trace.samples), n_ref=same.max_active,
                                   priors=same.priors)  # fmt: skip
        what.append(f"policy {args.policy!r}")
    out: dict[str, Any] = {"recorded_makespan_s": round(rec.makespan_s, 3), "time_scale": scale,
                           "profile": same.profile, "workers": same.workers, "env_slots": same.env_slots,
                           "runner_step_cost_s": round(runner_cost(rec.trace), 4), "start_offset_s": round(start.offset_s, 4),
                           "start_spacing_s": round(start.spacing_s, 4), "start_latency_s": round(start.latency_s, 4)}  # fmt: skip
    # the simulation starts its first chain when the recorded batch had started up (offset)
    out["predicted_same_s"] = round(simulate(rec.trace, same).summary.makespan_s * scale + start.offset_s, 3)
    if what:
        out["change"] = ", ".join(what)
        out["predicted_changed_s"] = round(simulate(rec.trace, changed).summary.makespan_s * scale + start.offset_s, 3)
    return out


def text(batch_id: int, out: dict[str, Any]) -> str:
    rec, same = out["recorded_makespan_s"], out["predicted_same_s"]
    lines = [f"batch {batch_id}: recorded makespan {rec:.1f} s ({out['workers']} engine worker(s), "
             f"{out['env_slots']} environment slots; engine model {out['profile']} at time scale {out['time_scale']:g})",
             f"  predicted, same config:  {same:10.1f} s  (x{same / rec:.3f} of recorded; the runner's measured cost "
             f"{1000 * out['runner_step_cost_s']:.0f} ms a step, chains started {1000 * out['start_offset_s']:.0f} ms in and "
             f"{1000 * out['start_spacing_s']:.0f} ms apart)"]  # fmt: skip
    if "change" in out:
        new = out["predicted_changed_s"]
        lines.append(f"  predicted, with {out['change']}: {new:10.1f} s  ({100 * (new / same - 1):+.1f} % "
                     "against the same config's prediction)")
    lines.append("  (virtual-time predictions: the simulated engine model with the recorded steps)")
    return "\n".join(lines)
