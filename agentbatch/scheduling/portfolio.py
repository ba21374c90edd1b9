"""The policy portfolio: named candidate configurations, and the rule that picks one from their
predicted makespans.

A `Candidate` is a whole scheduling configuration written independently of a batch (its admission
limit is a rule: "all" samples, the resource model's "n_ref", or a share of the environment
"slots"), so the same portfolio applies to any batch and hardware. It holds the three strong
baselines every comparison names (coupled at its best limit of the sweep S/4, S/2, S; decoupled
FIFO with every sample admitted; the paper's coupled baseline) and the defaults with their
variants (admission orders, queue ranks, admission limits, adaptive admission on or off).
`candidates()` is the one registry: the built-ins, then those a plugin adds (entry points of the
group `agentbatch.candidates`, loaded by `agentbatch.sim.portfolio`).

`choose(predictions, ...)` is the rule `scheduling.policy: auto` uses, pure arithmetic on
predicted makespans (the simulation lives in `agentbatch.sim.portfolio`); see its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentbatch.scheduling.defaults import DEFAULTS

COUPLED_BEST = "coupled, best limit"
FIFO_ALL = "decoupled FIFO, all admitted"
COUPLED_PAPER = "coupled at slots (paper)"
BASELINE_GROUPS = (COUPLED_BEST, FIFO_ALL, COUPLED_PAPER)
LIMIT_RULES = ("all", "n_ref", "slots")


@dataclass(frozen=True)
class Candidate:
    """One scheduling configuration of the portfolio.

    limit: "all" (every sample), "n_ref" (the resource model's reference concurrency) or "slots"
      (the environment slots), times `limit_factor` (at least 1 sample).
    baseline: the baseline group it belongs to (BASELINE_GROUPS), None for the others; the best of
      a group's members is that baseline (the coupled sweep has three).
    uses_priors: runs with the history priors (chain lengths, contexts) when there are any;
      baselines run without, as a user of another framework would.
    """

    name: str
    coupled: bool = DEFAULTS.coupled
    limit: str = "n_ref"
    limit_factor: float = 1.0
    env_queue: str = DEFAULTS.env_queue
    env_queue_params: Mapping[str, object] = field(default_factory=dict)
    inference_queue: str = DEFAULTS.inference_queue
    router: str = DEFAULTS.router
    priority: str = DEFAULTS.priority
    admission_order: str = DEFAULTS.admission_order
    admission_control: str = DEFAULTS.admission_control
    uses_priors: bool = True
    baseline: str | None = None

    def __post_init__(self) -> None:
        if self.limit not in LIMIT_RULES:
            raise ValueError(f"candidate {self.name!r}: limit must be one of {LIMIT_RULES}, got {self.limit!r}")
        if not (math.isfinite(self.limit_factor) and self.limit_factor > 0):
            raise ValueError(f"candidate {self.name!r}: limit_factor must be > 0, got {self.limit_factor!r}")
        if self.baseline is not None and self.baseline not in BASELINE_GROUPS:
            raise ValueError(f"candidate {self.name!r}: baseline must be one of {BASELINE_GROUPS}")

    def admission_limit(self, *, samples: int, env_slots: int, n_ref: int) -> int:
        base = {"all": samples, "n_ref": n_ref, "slots": env_slots}[self.limit]
        return max(1, int(base * self.limit_factor))

    def without_priors(self) -> Candidate:
        """How it runs without history: a prior-ranked order is the given order and history-aware
        CAAS is plain CAAS (samples without a prior are ranked by observed progress)."""
        if self.env_queue != "caas_history" and self.admission_order == "arrival":
            return self
        queue = "caas" if self.env_queue == "caas_history" else self.env_queue
        params = {} if self.env_queue == "caas_history" else self.env_queue_params
        return replace(self, env_queue=queue, env_queue_params=params, admission_order="arrival")

    def key(self) -> tuple[Any, ...]:
        """Everything but the name: two candidates with one key run alike."""
        return tuple((k, tuple(sorted(v.items())) if isinstance(v, Mapping) else v)
                     for k, v in asdict(self).items() if k != "name")


def _baselines() -> list[Candidate]:
    affinity: dict[str, Any] = dict(coupled=True, limit="slots", env_queue="fifo", router="trajectory_aware", priority="fcfs",
                    admission_order="arrival", admission_control="static", uses_priors=False)  # fmt: skip
    sweep = [Candidate(f"coupled at S*{f:g}", limit_factor=f, baseline=COUPLED_BEST, **affinity)
             for f in (0.25, 0.5, 1.0)]  # fmt: skip
    fifo_all = Candidate("decoupled FIFO, all admitted", baseline=FIFO_ALL, **{**affinity, "coupled": False, "limit": "all"})
    paper = Candidate("coupled at slots (paper)", baseline=COUPLED_PAPER, **{**affinity, "router": "round_robin"})
    return [*sweep, fifo_all, paper]


def _defaults_variants() -> list[Candidate]:
    return [
        Candidate("defaults"),
        Candidate("defaults, static limit", admission_control="static"),
        Candidate("defaults, kv_balanced order", admission_order="kv_balanced"),
        Candidate("defaults, arrival order", admission_order="arrival"),
        Candidate("defaults, rank progress", env_queue_params={"rank": "progress"}),
        Candidate("defaults, plain CAAS", env_queue="caas", admission_order="arrival"),
        Candidate("defaults at 2 x N_ref", limit_factor=2.0),
        Candidate("defaults at N_ref / 2", limit_factor=0.5, admission_control="static"),
        Candidate("CAAS, all admitted", limit="all", admission_control="static"),
        Candidate("CAAS, all admitted, arrival order", limit="all", admission_control="static",
                  admission_order="arrival"),
        Candidate("FIFO, all admitted, chain priority", limit="all", admission_control="static", env_queue="fifo",
                  admission_order="arrival"),
    ]  # fmt: skip


BUILTIN_CANDIDATES: tuple[Candidate, ...] = (*_baselines(), *_defaults_variants())


def candidates(extra: Iterable[Candidate] = ()) -> list[Candidate]:
    """The portfolio: the built-ins, then `extra` (plugins); names must be unique."""
    out = [*BUILTIN_CANDIDATES, *extra]
    seen: set[str] = set()
    for c in out:
        if not isinstance(c, Candidate):
            raise TypeError(f"a portfolio candidate must be a Candidate, got {type(c).__name__}")
        if c.name in seen:
            raise ValueError(f"candidate name {c.name!r} is used twice in the portfolio")
        seen.add(c.name)
    return out


def applicable(portfolio: Sequence[Candidate], has_priors: bool) -> list[Candidate]:
    """The candidates worth simulating, as they run: without priors each as `without_priors()`, and
    one that would then repeat an earlier one (all but the name) is left out. Baselines always stay."""
    if has_priors:
        return list(portfolio)
    out: list[Candidate] = []
    seen: set[tuple[Any, ...]] = set()
    for c in portfolio:
        run = c.without_priors()
        if run.key() not in seen or run.baseline:
            seen.add(run.key())
            out.append(run)
    return out


@dataclass(frozen=True)
class Choice:
    """The pick and why: `scores[name]` is the candidate's worst predicted ratio to the best baseline
    over the ensemble (inf: cut, it could not win), `fallback` the best-scoring baseline."""

    name: str
    score: float
    fallback: str
    fallback_score: float
    scores: dict[str, float]
    rule: str


RULE = ("robust minimax: each candidate scores its worst predicted makespan / best baseline's over the "
        "ensemble; the best-scoring baseline is the fallback, and a non-baseline runs instead only if it "
        "beats that baseline by the margin in every member (then the best-scoring such one)")  # fmt: skip


def choose(predictions: Mapping[str, Sequence[float]], portfolio: Sequence[Candidate],
           margin: float = 0.01) -> Choice:
    """Pick the candidate to run from predicted makespans (`predictions[name][m]`: member m of the
    ensemble; inf where the simulation was cut because it could not win).

    Rule (robust minimax): in each member m, B(m) is the best baseline's makespan; a candidate's
    score is max over m of T(c, m) / B(m). The fallback is the baseline with the lowest score. A
    candidate that is not a baseline runs instead only if it beats the fallback by the margin in
    every member, T(c, m) <= (1 - margin) x T(fallback, m); of those, the lowest score wins. Why:
    the promise is never to be slower than the best baseline, in a batch whose real chain lengths
    are only known as a distribution (the ensemble). A candidate that wins on the worst member but
    loses to the fallback in another has shown that its gain depends on the realisation, and the
    batch may be that one; the margin absorbs the prediction's own error. With one member (priors
    from history) it is the fastest candidate if it is faster than the best baseline by the margin.
    Because every baseline is a candidate scored by the same simulation, the choice is never
    predicted slower than the fallback in any member: the guarantee holds by construction for the
    prediction (the batch itself can still differ from every member)."""
    by_name = {c.name: c for c in portfolio}
    members = _members(predictions, by_name)
    best_base = [min(predictions[c][m] for c in by_name if by_name[c].baseline) for m in range(members)]
    scores = {name: max(_ratio(t, b) for t, b in zip(predictions[name], best_base, strict=True))
              for name in by_name if name in predictions}  # fmt: skip
    base_names = [n for n in scores if by_name[n].baseline]
    fallback = min(base_names, key=lambda n: (scores[n], base_names.index(n)))
    floor = [(1 - margin) * t for t in predictions[fallback]]
    others = [n for n in scores if not by_name[n].baseline
              and all(t <= f for t, f in zip(predictions[n], floor, strict=True))]  # fmt: skip
    pick = min(others, key=lambda n: (scores[n], others.index(n)), default=fallback)
    return Choice(pick, scores[pick], fallback, scores[fallback], scores, RULE)


def _members(predictions: Mapping[str, Sequence[float]], by_name: Mapping[str, Candidate]) -> int:
    lengths = {len(v) for v in predictions.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError("every candidate needs one prediction per ensemble member (at least one member)")
    unknown = sorted(set(predictions) - set(by_name))
    if unknown:
        raise ValueError(f"predictions for candidates not in the portfolio: {unknown}")
    members = lengths.pop()
    for m in range(members):
        if not any(by_name[n].baseline and math.isfinite(predictions[n][m]) for n in predictions):
            raise ValueError(f"ensemble member {m}: no baseline was simulated to its end")
    return members


def _ratio(t: float, b: float) -> float:
    return t / b if b > 0 else (1.0 if t <= 0 else math.inf)


def stored_choice(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The choice a batch's config carries, None when auto did not choose (or the batch predates it)."""
    scheduling = config.get("scheduling")
    choice = scheduling.get("choice") if isinstance(scheduling, dict) else None
    if not isinstance(choice, dict) or choice.get("mode") != "auto" or "candidates" not in choice:
        return None
    return choice


def running_policy_status(config: Mapping[str, Any]) -> dict[str, Any]:
    """Which policy a batch runs, from its stored config: `name`, the candidate that runs
    ("configured": the config's own scheduling fields), and `by`: "auto" (policy auto chose it: then
    also the simulations, earlier runs and harness window it chose with), "config" (the config names
    it) or "fallback" (policy auto could not choose: the log says why)."""
    scheduling = config.get("scheduling")
    policy = scheduling.get("policy") if isinstance(scheduling, dict) else None
    choice = stored_choice(config)
    if choice is not None:
        return {"name": policy if policy not in (None, "auto") else choice["chosen"], "by": "auto",
                "chosen": choice["chosen"], "simulations": choice["simulations"], "members": choice["members"],
                "harness": choice.get("harness")}  # fmt: skip
    if policy in (None, "auto", "configured"):
        return {"name": "configured", "by": "fallback" if policy == "auto" else "config"}
    return {"name": policy, "by": "config"}
