"""Virtual-time discrete-event simulation of a whole batch: the event-heap driver of the scheduling
core.

Every scheduling decision (admission and its order, coupled mode, routing, the environment and
worker queues, priorities, progress) is made by `agentbatch.scheduling.core.SchedulingCore`, the
same state machine the live runner drives (`tasks/coordinator.py`). This module only keeps time:
engine workers are `EngineModel` instances (the simulated engine's pure model), environment steps
take their recorded durations, and the core's grants start simulated work.

Grants reach their waiters as the live driver delivers them: a ticket granted at once in the call
that submitted it starts at once (its sample carries on, as an awaiting coroutine that did not
suspend would); grants to other waiters are handled after the current event, in the core's order
(as futures resolved in one callback wake in order on an event loop).

Events at the same instant are handled before any engine starts its next iteration there (phase
order), so requests arriving together are batched together, as a real engine's scheduler would.
Everything is deterministic: no randomness, no set iteration, ties broken by sequence numbers.
"""

from __future__ import annotations

import heapq
import zlib
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from agentbatch.scheduling.admission_control import EngineMeasurements, counters_from_metrics
from agentbatch.scheduling.admission_order import AdmissionHints, admission_sequence
from agentbatch.scheduling.core import ADMISSION, ENVIRONMENT, Grant, GrantRecord, PolicySwap
from agentbatch.scheduling.defaults import DEFAULTS
from agentbatch.scheduling.policies import AdmissionLimits, FcfsPriority
from agentbatch.scheduling.registry import PolicySpec, build_core
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad
from agentbatch.sim.model import EngineModel, SimRequest
from agentbatch.sim.profiles import EngineProfile, get_profile
from agentbatch.traces.schema import ENVIRONMENT as ENV_KIND
from agentbatch.traces.schema import INFERENCE, Trace, TraceSample

_FRESH_BASE = 1 << 60  # token ids unique to one sample's context (never shared)
_ZEROS = memoryview(bytes(8 * 4096))  # zero token ids, as int64 bytes (array.frombytes copies once)

# the policies VirtualBatch.decided() watches: whether they have chosen anything in a run
WATCHED_POLICIES = frozenset({"env_queue", "inference_queue", "admission_control"})

_SPAN_LIMIT = 4096  # decode-only iterations planned at once (EngineModel.plan_decodes)

# event phases within an instant: step and iteration ends first, then iteration starts, then
# checkpoints (which see the instant's whole state)
_END = 0
_ITER_START = 1
_CHECKPOINT = 2


def _policy(name: str) -> Callable[[], PolicySpec]:
    return lambda: PolicySpec(name)


@dataclass
class VirtualConfig:
    """What a virtual replay runs with. Policy names are the registry's (scheduling/registry.py);
    scheduling defaults are `agentbatch.scheduling.defaults.DEFAULTS`, as for `run` and `replay`."""

    workers: int = 2
    profile: str | EngineProfile = "llama3-8b-h100"
    profile_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"max_num_seqs": 64}
    max_active: int = DEFAULTS.max_active_samples  # samples admitted at once (reference concurrency)
    env_slots: int = DEFAULTS.env_slots
    # requests in flight per worker; None = the profile's max_num_seqs (no limit beyond the engine's)
    per_worker_inflight: int | None = DEFAULTS.per_worker_inflight
    coupled: bool = DEFAULTS.coupled
    router: PolicySpec = field(default_factory=_policy(DEFAULTS.router))
    env_queue: PolicySpec = field(default_factory=_policy(DEFAULTS.env_queue))
    inference_queue: PolicySpec = field(default_factory=_policy(DEFAULTS.inference_queue))
    priority: PolicySpec = field(default_factory=_policy(DEFAULTS.priority))
    env_time_scale: float = 1.0
    # the live runner's own time per step, seconds (transport, tokenizing, the store's commit): a sample
    # goes on this long after each step ends, its slot already free (coupled: its environment slot stays
    # held); measured by bench/live_ordering.py (0: steps cost nothing more)
    step_latency_s: float = 0.0
    # the live runner starts sample chains one after another: an admitted sample's first step is queued
    # this long after the previous sample's start or its own admission, whichever is later (0: all at once)
    sample_start_s: float = 0.0
    # the live runner's own time from a sample's admission to its first step (the store's write, the
    # environment's start): its first step is queued no sooner than this after its admission (0: at once)
    sample_start_latency_s: float = 0.0
    priors: dict[str, float] | None = None  # task id -> expected chain steps (history-aware CAAS)
    # task id -> the context a task's chain reaches (`context_priors`; the "kv_balanced" admission order)
    context_priors: dict[str, float] | None = None
    # "arrival" (trace order; "trace" is the same), "longest_prior_first", "longest_tail_first" or
    # "kv_balanced" (scheduling/admission_order.py)
    admission_order: str = DEFAULTS.admission_order
    # "engine": inference on the engine model; "recorded": each call takes its recorded duration_s
    # (no engine contention: for scheduling what-ifs and the live/virtual parity test)
    inference: str = "engine"
    record_grants: bool = False  # keep the core's grant log in RawResult.grants
    # "adaptive" (admission limit follows the engines' pressure, from max_active) or "static"
    admission_control: str = DEFAULTS.admission_control
    # an external harness sends the samples (the gateway): in trace order, at most this many open at
    # once (the next when one ends); they ask for admission as they come, whatever the admission order.
    # None: the runner asks for every sample's admission at the start, in the admission order
    harness: int | None = None

    def engine_profile(self) -> EngineProfile:
        return get_profile(self.profile, **self.profile_overrides)

    def limits(self, profile: EngineProfile) -> AdmissionLimits:
        return AdmissionLimits(
            max_active_samples=self.max_active,
            env_slots=self.env_slots,
            per_worker_inflight=self.per_worker_inflight or profile.max_num_seqs,
            coupled=self.coupled,
        )


class VirtualEngine(Protocol):
    """What the driver needs of an engine worker model (`EngineModel` is one)."""

    def add_request(self, req: SimRequest, now: float) -> None: ...
    def has_work(self) -> bool: ...
    def run_iteration(self, now: float) -> Any: ...
    def metrics(self) -> dict[str, float]: ...
    def forget_sample(self, sample_id: int) -> None: ...
    def plan_decodes(self, now: float, limit: int) -> list[float]: ...
    def commit_decodes(self, count: int) -> None: ...


def context_priors(*traces: Trace) -> dict[str, float]:
    """The context each task reached in earlier traces (mean over them): the largest prompt of its
    inference steps less the prefix it shares with its group (cached once for the group). The
    "kv_balanced" admission order's context priors (scheduling/admission_order.py)."""
    acc: dict[str, list[float]] = {}
    for trace in traces:
        for s in trace.samples:
            prompts = [st.prompt_tokens or 0 for st in s.steps if st.kind == INFERENCE]
            if prompts:
                acc.setdefault(s.task_id, []).append(max(0.0, max(prompts) - (s.shared_prefix_tokens or 0)))
    return {task: sum(v) / len(v) for task, v in acc.items()}


class _Sample:
    __slots__ = ("trace", "prog", "pos", "ctx", "admitted_at", "finished_at")

    def __init__(self, trace: TraceSample, prog: SampleProgress) -> None:
        self.trace = trace
        self.prog = prog
        self.pos = 0  # index into trace.steps of the next step
        self.ctx = array("q")  # token ids of the context; int64, 8 bytes a token (lists take ~36)
        self.admitted_at = 0.0
        self.finished_at: float | None = None


@dataclass(slots=True)
class _Running:
    """A granted step: its sample, ticket, slot and start."""

    sample: _Sample
    ticket: StepTicket
    slot: str
    started: float
    worker: int = -1  # engine index for inference on the engine model


@dataclass(slots=True, eq=False)
class _Span:
    """Decode-only iterations of one engine planned from `starts[0]`: `starts[i]` is when the i-th
    starts, the last entry when the iteration after them starts; `done` of them are applied."""

    starts: list[float]
    version: int
    worker: int = -1
    done: int = 0


_TAIL_CHECK_EVERY = 64  # events between two checks of the tail bound in a run that can be cut
_BOUND_SHARE = 0.999  # of each step's least time the tail bound counts (VirtualBatch._rest_s)


class SimulationCut(Exception):
    """A simulation stopped at its `stop_after_s`: the makespan is above `at_s`."""

    def __init__(self, at_s: float) -> None:
        super().__init__(f"stopped at {at_s:.1f}s of virtual time")
        self.at_s = at_s


@dataclass
class RawResult:
    steps: list[tuple[Any, ...]]  # STEP_FIELDS rows (tuples: they become a DataFrame)
    samples: list[tuple[Any, ...]]  # SAMPLE_FIELDS rows
    makespan_s: float
    events: int
    engine_metrics: dict[str, dict[str, float]]
    router_counters: dict[str, int]
    aged_pops: int
    grants: list[GrantRecord] = field(default_factory=list)  # with VirtualConfig.record_grants
    admission_limits: list[tuple[int, int, str]] = field(default_factory=list)  # (steps, limit, reason)


STEP_FIELDS = (
    "sample_id", "index", "kind", "enqueued_at", "started_at", "finished_at", "worker", "prompt_tokens",
    "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s", "decode_s", "engine_queue_s",
    "preemptions",
)  # fmt: skip
SAMPLE_FIELDS = ("index", "task_id", "steps_done", "score", "admitted_at", "finished_at", "last_worker")


def _default_engine_factory(profile: EngineProfile, name: str, policy: str) -> VirtualEngine:
    return EngineModel(profile, name=name, policy=policy)


EngineFactory = Callable[[EngineProfile, str, str], VirtualEngine]


class _Contexts:
    """Each sample's context as one growing token array: the shared prefix of its group, then one
    id unique in the batch followed by zeros for each new segment (block hashes are chained, so
    every block after a unique token is unique, and zeros are a memcpy, not an int per token)."""

    def __init__(self) -> None:
        self._fresh = _FRESH_BASE
        self._shared: dict[str, array[int]] = {}

    def prompt(self, s: _Sample, length: int) -> array[int]:
        ctx = s.ctx
        if not ctx and s.trace.shared_prefix_tokens:
            ctx.extend(self._shared_prefix(s.trace.prefix_group, s.trace.shared_prefix_tokens))
        if len(ctx) < length:  # observation / template tokens not yet in the context
            self.extend(ctx, length - len(ctx))
        elif len(ctx) > length:  # the agent shortened its context: a new array (see below)
            s.ctx = ctx = ctx[:length]
        # The context itself is the prompt (no copy). The engine keeps it only as its per-sample
        # memo, whose prefix stays valid because a context only grows by appends while it lives.
        return ctx

    def _shared_prefix(self, group: str, n: int) -> array[int]:
        shared = self._shared.get(group)
        if shared is None or len(shared) < n:
            base = (zlib.crc32(group.encode()) + 1) << 24
            shared = array("q", range(base, base + n))
            self._shared[group] = shared
        return shared[:n]

    def extend(self, ctx: array[int], n: int) -> None:
        if n <= 0:
            return
        ctx.append(self._fresh)
        self._fresh += 1
        n -= 1
        while n > 0:
            k = min(n, len(_ZEROS) // 8)
            ctx.frombytes(_ZEROS[: 8 * k])
            n -= k


@dataclass(frozen=True)
class Checkpoints:
    """Call `callback(batch, now)` every `every_s` of virtual time while samples remain: the batch
    may swap its core's policies there (re-planning, sim/replan.py)."""

    every_s: float
    callback: Callable[[VirtualBatch, float], None]


def _progress(trace: Trace, config: VirtualConfig) -> list[SampleProgress]:
    priors = config.priors or {}
    return [SampleProgress(sample_id=s.index, task_id=s.task_id, arrival_seq=s.index,
                           prior_chain_steps=priors.get(s.task_id)) for s in trace.samples]  # fmt: skip


def _admission_sequence(progress: list[SampleProgress], config: VirtualConfig, profile: EngineProfile,
                        limits: AdmissionLimits) -> list[SampleProgress]:
    """The samples in the order they ask for admission. The "kv_balanced" order also needs the
    context priors, the admission limit it starts at and the KV capacity of all workers (as the live
    flow gets them from history and the plan). Samples a harness sends come in trace order."""
    if config.harness is not None:
        return list(progress)
    hints = None
    if config.context_priors is not None:
        kv = profile.kv_capacity_tokens * config.workers
        hints = AdmissionHints(config.context_priors, limits.max_active_samples, kv)
    return admission_sequence(progress, config.admission_order, hints)


def admission_order(trace: Trace, config: VirtualConfig) -> tuple[int, ...]:
    """The trace indices of the samples in the order a VirtualBatch of `config` asks for their
    admission: all that the admission order, the priors it reads and the context priors decide."""
    profile = config.engine_profile()
    ordered = _admission_sequence(_progress(trace, config), config, profile, config.limits(profile))
    return tuple(p.sample_id for p in ordered)


class VirtualBatch:
    """One simulated batch. `run()` once; it returns the raw step and sample records."""

    _next_start = 0.0  # when the next admitted sample starts (VirtualConfig.sample_start_s)
    checkpoints: Checkpoints | None = None

    def __init__(self, trace: Trace, config: VirtualConfig, engine_factory: EngineFactory | None = None) -> None:
        if config.inference not in ("engine", "recorded"):
            raise ValueError(f"inference must be 'engine' or 'recorded', got {config.inference!r}")
        self.trace = trace
        self.cfg = config
        self.profile = config.engine_profile()
        self.limits = config.limits(self.profile)
        self.names = [f"sim-{i}" for i in range(config.workers)]
        self.core = build_core(self.limits, self.names, env_queue=config.env_queue,
                               inference_queue=config.inference_queue, router=config.router,
                               priority=config.priority, record=config.record_grants,
                               admission_control=config.admission_control)  # fmt: skip
        # the engines' scheduling policy, fixed at launch (a swapped priority policy reaches them as
        # request priorities only, which "fcfs" engines ignore)
        self.engine_policy = "fcfs" if isinstance(self.core.priority, FcfsPriority) else "priority"
        factory = engine_factory or _default_engine_factory
        # the least time of an engine iteration (the tail bound's): the engine model's fixed cost; none
        # known for another engine model
        self._iteration_floor_s = self.profile.cost.c0 if engine_factory is None else 0.0
        self.engines = [factory(self.profile, n, self.engine_policy) for n in self.names]
        self._index = {n: i for i, n in enumerate(self.names)}
        self._wire_core()
        self.busy = [False] * config.workers
        # engines that can run decode-only iterations without an event each (EngineModel.plan_decodes)
        self._fast = all(hasattr(e, "plan_decodes") for e in self.engines)
        self._spans: dict[int, _Span] = {}
        self._span_version = [0] * config.workers
        self._heap: list[tuple[Any, ...]] = []
        self._seq = 0
        self._ctx = _Contexts()
        self._requests: dict[str, _Running] = {}
        self._steps: list[tuple[Any, ...]] = []
        self._wake: deque[Grant] = deque()  # grants to waiters, handled after the current event
        self._events = 0
        self._decided: set[str] = set()  # see decided()
        self._unsent: deque[_Sample] = deque()  # samples the harness has yet to send (VirtualConfig.harness)
        progress = _progress(trace, config)
        by_id = {p.sample_id: _Sample(s, p) for s, p in zip(trace.samples, progress, strict=True)}
        self._all = list(by_id.values())
        self._order = [by_id[p.sample_id] for p in _admission_sequence(progress, config, self.profile, self.limits)]

    def _kv_loads(self, loads: list[WorkerLoad]) -> list[WorkerLoad]:
        for load in loads:
            load.kv_usage = self.engines[self._index[load.name]].metrics()["kv_cache_usage_perc"]
        return loads

    def _engine_counters(self) -> EngineMeasurements:
        return counters_from_metrics([e.metrics() for e in self.engines])

    # --- event heap ----------------------------------------------------------------------------
    def _push(self, t: float, phase: int, kind: str, arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, phase, self._seq, kind, arg))

    # --- grants: the driver side of the core -----------------------------------------------------
    def _submit(self, s: _Sample, ticket: StepTicket, now: float) -> None:
        waits = ticket.step_index >= 0  # a step (not an admission) until granted
        for g in self.core.submit(ticket, now):
            if g.ticket is ticket:  # granted in the call that asked: the sample goes on at once
                waits = False
                self._start(g, now)
            else:
                self._wake.append(g)
        if waits:
            self._note_waiting(ticket)

    def _note_waiting(self, ticket: StepTicket) -> None:
        """A step waits for a slot: with another one waiting in its queue, the queue's policy will
        choose which goes first (decided())."""
        if ticket.kind == StepKind.ENVIRONMENT:
            if len(self.core.environment.queue) > 1:
                self._decided.add("env_queue")
        elif ticket.worker is not None and len(self.core.workers[ticket.worker].queue) > 1:
            self._decided.add("inference_queue")

    def decided(self) -> frozenset[str]:
        """The policies that have chosen something so far where another policy could have chosen
        otherwise: "env_queue" / "inference_queue" once two steps waited in the environment queue /
        a worker's queue at once (the policy's order then decides which goes first; with one waiting
        step every queue serves it), "admission_control" once the adaptive controller moved the
        admission limit. A run with another policy in a part not named here, all else the same, is
        this run event for event, up to here (sim/portfolio.py reuses runs so)."""
        out = set(self._decided)
        ctl = self.core.controller
        if ctl is not None and any(d.limit != ctl.start for d in ctl.history):
            out.add("admission_control")
        return frozenset(out)

    def _drain(self, now: float) -> None:
        while self._wake:
            self._start(self._wake.popleft(), now)

    def _start(self, g: Grant, now: float) -> None:
        s = cast(_Sample, g.ticket.payload)
        if g.resource == ADMISSION:
            s.admitted_at = now
            if self.cfg.sample_start_s > 0 or self.cfg.sample_start_latency_s > 0:
                self._next_start = max(now + self.cfg.sample_start_latency_s, self._next_start) + self.cfg.sample_start_s
                self._push(self._next_start, _END, "advance", s)
            else:
                self._advance(s, now)
            return
        run = _Running(s, g.ticket, g.slot, now)
        st = s.trace.steps[s.pos]
        if g.resource == ENVIRONMENT:
            self._push(now + (st.duration_s or 0.0) * self.cfg.env_time_scale, _END, "step_end", run)
        elif self.cfg.inference == "recorded":
            self._push(now + (st.duration_s or 0.0), _END, "step_end", run)
        else:
            self._add_request(run, self._index[g.resource], now)

    # --- samples -------------------------------------------------------------------------------
    def _advance(self, s: _Sample, now: float) -> None:
        steps = s.trace.steps
        if s.pos >= len(steps):
            self._finish(s, now)
            return
        st = steps[s.pos]
        kind = StepKind.INFERENCE if st.kind == INFERENCE else StepKind.ENVIRONMENT
        ticket = StepTicket(sample=s.prog, kind=kind, step_index=st.index, enqueued_at=now,
                            prompt_tokens=int(st.prompt_tokens or 0), payload=s)  # fmt: skip
        self._submit(s, ticket, now)

    def _finish(self, s: _Sample, now: float) -> None:
        s.finished_at = now
        s.ctx = array("q")  # free the context
        for engine in self.engines:  # drop the engines' per-sample prompt memo
            engine.forget_sample(s.trace.index)
        self._wake.extend(self.core.finish(s.prog, now))
        if self._unsent:  # the harness sends its next sample
            self._ask_admission(self._unsent.popleft(), now)

    def _completed(self, run: _Running, now: float) -> _Sample:
        """The core learns that the step ended (progress, slot back); the sample moves past it."""
        self._wake.extend(self.core.complete(run.ticket, run.slot, now))
        s = run.sample
        s.pos += 1
        return s

    # --- environment and recorded-duration inference ---------------------------------------------
    def _step_end(self, run: _Running, now: float) -> None:
        s = run.sample
        st = s.trace.steps[s.pos]
        if st.kind == INFERENCE:
            self._steps.append((s.trace.index, st.index, INFERENCE, run.ticket.enqueued_at, run.started, now,
                                run.ticket.worker, st.prompt_tokens, st.cached_prompt_tokens or 0, 0,
                                st.output_tokens, None, None, 0.0, 0))  # fmt: skip
            self._ctx.extend(s.ctx, int(st.output_tokens or 0))
            self._next(self._completed(run, now), now)
            return
        self._steps.append((s.trace.index, st.index, ENV_KIND, run.ticket.enqueued_at, run.started, now, run.slot,
                            None, None, None, None, None, None, None, None))  # fmt: skip
        if st.obs_tokens:
            self._ctx.extend(s.ctx, st.obs_tokens)
        self._completed(run, now)
        if st.done:
            s.pos = len(s.trace.steps)
        self._next(s, now)

    def _next(self, s: _Sample, now: float) -> None:
        """A step ended (its slot is free): the sample goes on after the runner's own step latency."""
        if self.cfg.step_latency_s > 0:
            self._push(now + self.cfg.step_latency_s, _END, "advance", s)
        else:
            self._advance(s, now)

    # --- inference on the engine model ---------------------------------------------------------
    def _add_request(self, run: _Running, w: int, now: float) -> None:
        s = run.sample
        st = s.trace.steps[s.pos]
        prio = self.core.request_priority(s.prog)
        rid = f"{s.trace.index}:{st.index}"
        req = SimRequest(
            request_id=rid, sample_id=s.trace.index, prompt=self._ctx.prompt(s, int(st.prompt_tokens or 1)),
            output_tokens=max(1, int(st.output_tokens or 1)), priority=0 if prio is None else prio, arrival=now,
        )  # fmt: skip
        if self._spans:
            self._cut_span(w)
        self.engines[w].add_request(req, now)
        run.worker = w
        self._requests[rid] = run
        if not self.busy[w]:
            self.busy[w] = True
            self._push(now, _ITER_START, "iter_start", w)

    def _iter_start(self, w: int, now: float) -> None:
        engine = self.engines[w]
        if not engine.has_work():
            self.busy[w] = False
            return
        if self._fast:
            starts = engine.plan_decodes(now, _SPAN_LIMIT)
            if len(starts) > 1:  # decode-only iterations: one event at their end (_Span)
                self._spans[w] = span = _Span(starts, self._span_version[w], w)
                self._push(starts[-1], _ITER_START, "span_end", span)
                return
        res = engine.run_iteration(now)
        self._push(now + res.duration, _END, "iter_end", (w, res))

    def _iter_end(self, w: int, res: Any, now: float) -> None:
        for stats in res.finished:
            run = self._requests.pop(stats.request_id)
            s = run.sample
            st = s.trace.steps[s.pos]
            self._steps.append((
                s.trace.index, st.index, INFERENCE, run.ticket.enqueued_at, run.started, now, self.names[w],
                stats.prompt_tokens, stats.cached_prompt_tokens, stats.recomputed_tokens, stats.output_tokens,
                stats.prefill_s, stats.decode_s, stats.queue_s, stats.preemptions,
            ))  # fmt: skip
            self._ctx.extend(s.ctx, stats.output_tokens)
            self._next(self._completed(run, now), now)
        # Start the next iteration after every other event of this instant (phase order).
        self._push(now, _ITER_START, "iter_start", w)

    # --- decode-only spans: iterations without an event each ------------------------------------
    def _settle(self, now: float) -> None:
        """Apply the planned iterations that started before `now` (as the events of the exact
        schedule would have by now): whatever reads or changes an engine then sees its true state."""
        for w, span in self._spans.items():
            k = bisect_left(span.starts, now, hi=len(span.starts) - 1)
            if k > span.done:
                self.engines[w].commit_decodes(k - span.done)
                span.done = k

    def _span_end(self, span: _Span, now: float) -> None:
        w = span.worker
        if span.version != self._span_version[w]:
            return  # cut short by a request (_cut_span)
        self._settle(now)
        del self._spans[w]
        self._iter_start(w, now)

    def _cut_span(self, w: int) -> None:
        """A request reached engine w during a span (already settled to now): the iteration at the
        next boundary runs in full, and may admit it."""
        span = self._spans.pop(w, None)
        if span is not None:
            self._span_version[w] += 1
            self._push(span.starts[span.done], _ITER_START, "iter_start", w)

    # --- main loop -----------------------------------------------------------------------------
    def _admit_all(self) -> None:
        # Samples ask for admission in the admission order, each going on at once when admitted
        # (as the live flow's sample coroutines start in that order); a harness sends its first ones.
        first = len(self._order) if self.cfg.harness is None else max(1, self.cfg.harness)
        self._unsent = deque(self._order[first:])
        for s in self._order[:first]:
            self._ask_admission(s, 0.0)
        self._drain(0.0)

    def _ask_admission(self, s: _Sample, now: float) -> None:
        ticket = self.core.admission_ticket(s.prog, now)
        ticket.payload = s
        self._submit(s, ticket, now)

    def run(self, stop_after_s: float | None = None) -> RawResult:
        """Simulate to the end; with `stop_after_s`, raise `SimulationCut` as soon as the virtual
        clock passes it (the makespan is known to be larger: a candidate that cannot win). With
        `checkpoints` set, its callback runs every `every_s` of virtual time while samples remain."""
        self._admit_all()
        if self.checkpoints is not None:
            self._push(self.checkpoints.every_s, _CHECKPOINT, "checkpoint", None)
        return self.resume(stop_after_s)

    def resume(self, stop_after_s: float | None = None) -> RawResult:
        """Go on from where the simulation stands (a fork made at a checkpoint: sim/replan.py)."""
        heap = self._heap
        stop = float("inf") if stop_after_s is None else stop_after_s
        handlers: dict[str, Callable[[Any, float], None]] = {
            "iter_start": self._iter_start, "iter_end": lambda a, t: self._iter_end(a[0], a[1], t),
            "step_end": self._step_end, "advance": self._advance, "span_end": self._span_end,
            "checkpoint": self._checkpoint,
        }  # fmt: skip
        rest = self._rest_s() if stop_after_s is not None else None
        while heap:
            now, _, _, kind, arg = heapq.heappop(heap)
            if now > stop:
                raise SimulationCut(now)
            if rest is not None and not self._events % _TAIL_CHECK_EVERY:
                tail = self._tail_bound(now, rest)
                if tail > stop:
                    raise SimulationCut(tail)
            if self._spans:
                self._settle(now)
            self._events += 1
            handlers[kind](arg, now)
            self._drain(now)
        return self._result()

    def _checkpoint(self, _: Any, now: float) -> None:
        cp = self.checkpoints
        if cp is None or all(s.finished_at is not None for s in self._all):
            return  # a fork, or nothing left to plan
        cp.callback(self, now)
        self._drain(now)
        self._push(now + cp.every_s, _CHECKPOINT, "checkpoint", None)

    # --- re-planning (sim/replan.py) ------------------------------------------------------------
    def positions(self) -> dict[int, tuple[TraceSample, int, bool]]:
        """Each unfinished sample by trace index: its trace, the position of its next (or running)
        step, and whether it is admitted (then that step has been asked for)."""
        return {s.trace.index: (s.trace, s.pos, self.core.is_admitted(s.prog.sample_id))
                for s in self._all if s.finished_at is None}  # fmt: skip

    def all_progress(self) -> list[SampleProgress]:
        return [s.prog for s in self._all]

    def set_futures(self, futures: Mapping[int, TraceSample], now: float) -> None:
        """Give samples (by trace index) new traces, the same up to their current step (a fork that
        predicts the remainder). A running step of recorded duration (an environment action, or
        inference with inference="recorded") ends at its start plus its new duration, at the
        earliest `now`; inference on an engine model keeps what the model planned."""
        for s in self._all:
            if s.trace.index in futures:
                s.trace = futures[s.trace.index]
        heap = []
        for t, phase, seq, kind, arg in self._heap:
            if kind == "step_end":
                st = arg.sample.trace.steps[arg.sample.pos]
                scale = self.cfg.env_time_scale if st.kind != INFERENCE else 1.0
                t = max(now, arg.started + (st.duration_s or 0.0) * scale)
            heap.append((t, phase, seq, kind, arg))
        heapq.heapify(heap)
        self._heap = heap

    def swapped(self, swap: PolicySwap, now: float) -> None:
        """Run the rest with other policies (SchedulingCore.swap); the grants it makes start now.
        decided() then tells what the new policies decide from here on."""
        self._wake.extend(self.core.swap(swap, now))
        self._wire_core()
        self._decided = set()
        if len(self.core.environment.queue) > 1:  # the new queue orders the steps moved into it
            self._decided.add("env_queue")
        if any(len(pool.queue) > 1 for pool in self.core.workers.values()):
            self._decided.add("inference_queue")
        self._drain(now)

    def _wire_core(self) -> None:
        """Connect the core's router and admission controller to the engine models."""
        self.router = self.core.router
        # as a live router reads vllm:kv_cache_usage_perc from /metrics
        self.core.load_hook = self._kv_loads if self.core.router.wants_kv_usage else None
        # Adaptive admission reads the engine models' counters (as live reads /metrics); recorded
        # inference has no engine to measure.
        if self.core.controller is not None and self.cfg.inference == "engine":
            self.core.engine_counters = self._engine_counters

    def _rest_s(self) -> list[list[float]]:
        """Per sample and step position p: the time its chain still needs after step p, whatever the
        policy: each environment step its duration once started; each inference call its recorded
        duration with recorded inference, else at least one engine iteration per output token (an
        iteration of the engine model takes at least its cost model's fixed `c0`). A step that ends the sample ends the
        chain. All less 0.1 %: a chain of float additions in another order can end a hair below
        the exact sum, and the bound must stay below what the run gives."""
        out = []
        scale, floor = self.cfg.env_time_scale, self._iteration_floor_s
        recorded = self.cfg.inference == "recorded"
        for s in self._all:
            steps = s.trace.steps
            after = [0.0] * (len(steps) + 1)  # time of steps p.. (to the end or the first done)
            for p in range(len(steps) - 1, -1, -1):
                st = steps[p]
                env = st.kind != INFERENCE
                if env:
                    own = (st.duration_s or 0.0) * scale
                elif recorded:
                    own = st.duration_s or 0.0
                else:
                    own = floor * max(1, int(st.output_tokens or 1))
                after[p] = _BOUND_SHARE * own + (0.0 if env and st.done else after[p + 1])
            out.append([0.0 if steps[p].kind != INFERENCE and steps[p].done else after[p + 1]
                        for p in range(len(steps))] + [0.0])  # fmt: skip
        return out

    def _tail_bound(self, now: float, rest: list[list[float]]) -> float:
        """A lower bound on the makespan at `now`: no unfinished sample ends before its remaining
        steps have run one after another, each in the least time it can take (`_rest_s`; what
        lets a cut come before the clock reaches the stop)."""
        return max((now + rest[i][s.pos] for i, s in enumerate(self._all) if s.finished_at is None), default=now)

    def _result(self) -> RawResult:
        unfinished = [s.trace.index for s in self._all if s.finished_at is None]
        if unfinished:
            raise RuntimeError(f"simulation stalled: {len(unfinished)} samples never finished (first {unfinished[:5]})")
        samples = [
            (s.trace.index, s.trace.task_id, s.prog.steps_done, s.trace.score, s.admitted_at, s.finished_at,
             s.prog.last_worker)
            for s in self._all
        ]  # fmt: skip
        return RawResult(
            steps=self._steps,
            samples=samples,
            makespan_s=max((s.finished_at or 0.0) for s in self._all) if self._all else 0.0,
            events=self._events,
            engine_metrics={n: dict(e.metrics()) for n, e in zip(self.names, self.engines, strict=True)},
            router_counters=self.core.router.decision_counts(),
            aged_pops=self.core.environment.queue.aged_pops,
            grants=list(self.core.log or []),
            admission_limits=[(d.steps, d.limit, d.reason) for d in (self.core.controller.history
                              if self.core.controller is not None else [])],
        )
