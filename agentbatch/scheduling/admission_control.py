"""Adaptive admission: the admission limit follows measured pressure, on both clocks.

The resource model's reference concurrency N_ref is where the limit starts. After every window of
completed steps the controller reads what the engines and the core measured over that window and
moves the limit (additive increase, multiplicative decrease, as TCP and Concur-style feedback
admission do):

- **back off on thrash**: the engines recomputed evicted prefixes (recomputed / prompt tokens above
  `thrash_recompute`), preempted running requests (preemptions per completed step above
  `thrash_preempt`), or the window's prefix-cache hit rate fell `thrash_hit_drop` below the best
  window seen while KV usage is at least `thrash_kv`. Then the limit drops to `backoff` x the samples admitted now, so it bites at once,
  and the controller remembers where thrash began: it never grows back to that many samples.
  A back-off on recompute is a trial: once it has taken effect (no more samples admitted than the
  new limit), the next window's recomputed share of prompt tokens must have fallen below
  `undo_frac` x the share that caused it.
  If not, the recompute is not caused by concurrency (a hybrid engine with fewer state checkpoints
  than samples recomputes at any limit), so fewer samples only idle the GPU: the limit goes back
  to where it was, and only pressure above 1.5x that level counts as thrash from then on;
- **grow while the GPU idles**, back up to the start, and above it up to `ceiling` when one is set
  and the engines are measured: samples wait for admission, no inference request waits (in the
  engines or for a worker slot), KV usage is below `grow_kv`, and the environment queue is not
  longer than the environment slots (so more samples would give the engines work, not the queue).
  Without a ceiling the start is the cap until the evidence covers whole chains: the resource model
  priced N_ref for the contexts samples reach, while a window early in a batch measures short
  contexts and a KV usage of the running requests only (cached prefixes of waiting samples are not
  in it, in vLLM or the engine model), so growth on early windows admits samples whose caches evict
  each other later, when the limit can no longer take them back (an admitted sample is never
  stopped). Once as many samples have finished as the start admits, and the batch so far has
  recomputed at most `quiet_recompute` of its prompt tokens and never thrashed, the cache has held
  whole chains at this concurrency and the limit may grow without bound (N_ref was too cautious,
  e.g. a hybrid engine's checkpoint count bounding short chains).

It is pure: no clock, no I/O. The scheduling core feeds it (`SchedulingCore.enable_adaptive_admission`)
on each completed step with its own queue lengths and the engines' cumulative counters from a hook
(the engine model's metrics in virtual time, the workers' `/metrics` live), and applies its limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineMeasurements:
    """Engine-side measurements summed over the workers: counters cumulative, gauges current.
    `recomputed_tokens` is None where the engine does not export it (vLLM): preemptions and the hit
    rate then stand for it."""

    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0  # prefix-cache hits (tokens)
    preemptions: float = 0.0
    recomputed_tokens: float | None = None
    kv_usage: float = 0.0  # mean over the workers, 0..1
    waiting: int = 0  # requests queued inside the engines
    measured: bool = True  # False: no metrics source (the zeros above are not evidence of an idle GPU)


@dataclass(frozen=True, slots=True)
class AdmissionSignals:
    """One observation: the core's own state and the engines' counters."""

    admitted: int  # samples admitted now
    waiting_admission: int  # samples waiting to be admitted
    env_queued: int  # environment actions waiting for a slot
    env_slots: int
    inference_queued: int  # inference calls waiting for a worker slot in the core
    steps_completed: int = 0  # steps (both kinds) completed so far, counted by the core
    samples_finished: int = 0  # samples ended so far, counted by the core
    engine: EngineMeasurements = field(default_factory=EngineMeasurements)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    window_steps: int = 0  # completed steps between decisions; 0 = max(8, start // 2)
    floor_frac: float = 0.50  # the limit never goes below floor_frac x start (and never below 1)
    # With measured engine counters the limit may grow above its start up to this; None: the start,
    # unbounded once whole chains ran quietly (module docstring); without counters only to the start.
    ceiling: int | None = None
    backoff: float = 0.75
    grow_frac: float = 0.25  # additive step: max(1, grow_frac x limit)
    thrash_recompute: float = 0.10
    thrash_preempt: float = 0.01
    thrash_hit_drop: float = 0.10
    thrash_kv: float = 0.85  # the hit-rate drop counts only with KV usage at least this
    grow_kv: float = 0.70
    quiet_recompute: float = 0.01  # above the start only while the batch so far recomputed at most this share
    undo_frac: float = 0.5  # a back-off that did not bring the pressure below this share is undone


@dataclass(slots=True)
class Decision:
    """What one window decided (kept in `AdmissionController.history` for reports and tests)."""

    steps: int
    limit: int
    reason: str  # "thrash", "grow", "hold", "relieved" or "undo" (a back-off judged)
    hit_rate: float | None


class AdmissionController:
    """Additive-increase / multiplicative-decrease admission limit (see the module docstring)."""

    def __init__(self, start: int, settings: ControllerSettings | None = None) -> None:
        if start < 1:
            raise ValueError(f"the controller's start limit must be >= 1, got {start}")
        self.settings = s = settings or ControllerSettings()
        self.start = start
        self.limit = start
        self.floor = max(1, int(start * s.floor_frac))
        self.ceiling = max(start, s.ceiling) if s.ceiling is not None else start
        self.thrash_at: int | None = None  # samples admitted when thrash was first measured
        self.window = s.window_steps or max(8, start // 2)
        self.history: list[Decision] = []
        self._steps = 0
        self._next_at = self.window
        self._last: EngineMeasurements | None = None
        self._best_hit: float | None = None
        self._last_steps = 0
        self._trial: tuple[int, float] | None = None  # a back-off on trial: (limit before, pressure then)
        self._tolerated = 0.0  # pressure that a back-off did not relieve
        self._seen_whole_chains = False  # as many samples finished as the start admits
        self._quiet = False  # this window recomputed (almost) nothing

    def due(self, steps_completed: int) -> bool:
        """True when a window of steps has completed since the last decision."""
        self._steps = steps_completed
        return steps_completed >= self._next_at

    def update(self, signals: AdmissionSignals) -> int:
        """Decide on one window; returns the new limit."""
        self._next_at = self._steps + self.window
        eng = signals.engine
        last, self._last = self._last, eng
        if last is None:  # the first observation only sets the reference point
            self._last_steps = signals.steps_completed
            return self.limit
        hit = _ratio(eng.cached_tokens - last.cached_tokens, eng.prompt_tokens - last.prompt_tokens)
        steps, self._last_steps = signals.steps_completed - self._last_steps, signals.steps_completed
        pressure = _pressure(eng, last)
        self._note_quiet(signals)
        if signals.admitted > self.limit:  # the last back-off has not taken effect yet: judge it first
            reason = "hold"
        elif self._trial is not None and pressure is not None:
            reason = self._judge_trial(pressure)
        elif (cause := self._thrashing(eng, last, hit, steps, pressure)) is not None:
            reason = "thrash"
            self._back_off(signals.admitted, pressure if cause == "recompute" else None)
        elif self.limit < self._top(eng.measured) and self._idle(signals):
            reason = "grow"
            self.limit = min(self._top(eng.measured), self.limit + max(1, int(self.limit * self.settings.grow_frac)))
        else:
            reason = "hold"
        if hit is not None:
            self._best_hit = hit if self._best_hit is None else max(self._best_hit, hit)
        self.history.append(Decision(self._steps, self.limit, reason, hit))
        return self.limit

    def _note_quiet(self, signals: AdmissionSignals) -> None:
        """Whether whole chains have run at this concurrency with (almost) no recompute so far."""
        eng = signals.engine
        total = None if eng.recomputed_tokens is None else _ratio(eng.recomputed_tokens, eng.prompt_tokens)
        self._seen_whole_chains = signals.samples_finished >= self.start
        self._quiet = total is not None and total <= self.settings.quiet_recompute and self.thrash_at is None

    def _back_off(self, admitted: int, recompute: float | None) -> None:
        base = min(self.limit, max(1, admitted))
        self.thrash_at = base if self.thrash_at is None else min(self.thrash_at, base)
        if recompute is not None:
            self._trial = (self.limit, recompute)  # judged once the back-off has taken effect
        self.limit = max(self.floor, int(base * self.settings.backoff))

    def _judge_trial(self, pressure: float) -> str:
        assert self._trial is not None
        before, then = self._trial
        self._trial = None
        if pressure < self.settings.undo_frac * then:
            return "relieved"
        self.limit, self.thrash_at = before, None
        self._tolerated = max(self._tolerated, then)
        return "undo"

    def _top(self, measured: bool) -> int:
        """How far the limit may grow: the ceiling (measured) or the start, below where thrash began."""
        top = self.ceiling if measured else self.start
        if measured and self.settings.ceiling is None and self._seen_whole_chains and self._quiet:
            top = 1 << 30
        return top if self.thrash_at is None else max(self.floor, min(top, self.thrash_at - 1))

    def _thrashing(self, eng: EngineMeasurements, last: EngineMeasurements, hit: float | None, steps: int,
                   pressure: float | None) -> str | None:
        """What shows thrash in this window ("recompute", "preempt", "hit"), or None."""
        s = self.settings
        if pressure is not None and pressure > max(s.thrash_recompute, 1.5 * self._tolerated):
            return "recompute"
        preempt = _ratio(eng.preemptions - last.preemptions, steps)
        if preempt is not None and preempt > s.thrash_preempt:
            return "preempt"
        # A lower hit rate alone is often just other tasks' prompts; it means eviction only when the
        # cache is full.
        if (hit is not None and self._best_hit is not None and hit < self._best_hit - s.thrash_hit_drop
                and eng.kv_usage >= s.thrash_kv):
            return "hit"
        return None

    def _idle(self, sig: AdmissionSignals) -> bool:
        return (
            sig.waiting_admission > 0
            and sig.admitted >= self.limit  # the limit, not the supply of samples, holds admission back
            and sig.inference_queued == 0
            and sig.engine.waiting == 0
            and sig.engine.kv_usage < self.settings.grow_kv
            and sig.env_queued <= sig.env_slots
        )


def _pressure(eng: EngineMeasurements, last: EngineMeasurements) -> float | None:
    """The window's recomputed share of prompt tokens (None where the engine does not count it)."""
    if eng.recomputed_tokens is None or last.recomputed_tokens is None:
        return None
    return _ratio(eng.recomputed_tokens - last.recomputed_tokens, eng.prompt_tokens - last.prompt_tokens)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def counters_from_metrics(workers: list[dict[str, float]]) -> EngineMeasurements:
    """Sum engine-model metrics dicts (`EngineModel.metrics()`: vLLM's metric names) over workers.
    Prefix-cache queries and hits count tokens there, as in vLLM."""
    if not workers:
        return EngineMeasurements()
    total = {k: sum(m.get(k, 0.0) for m in workers) for k in workers[0]}
    return EngineMeasurements(
        prompt_tokens=total.get("prefix_cache_queries_total", 0.0),
        cached_tokens=total.get("prefix_cache_hits_total", 0.0),
        preemptions=total.get("num_preemptions_total", 0.0),
        recomputed_tokens=total.get("recomputed_tokens_total"),
        kv_usage=total.get("kv_cache_usage_perc", 0.0) / len(workers),
        waiting=int(total.get("num_requests_waiting", 0.0)),
    )
