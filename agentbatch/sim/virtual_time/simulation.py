"""Virtual-time discrete-event simulation of a whole batch: no sleeping, an event heap.

Engine workers are `EngineModel` instances (the simulated engine's pure model), environment slots a
counted pool, and the scheduling policies are the very objects the live runner uses: the admission
limits (coupled or decoupled), the router, the environment-action queue, each worker's inference
queue and the per-request priority. Environment steps take their recorded durations.

Events at the same instant are handled before any engine starts its next iteration there (phase
order), so requests arriving together are batched together, as a real engine's scheduler would.
Everything is deterministic: no randomness, no set iteration, ties broken by sequence numbers.
"""

from __future__ import annotations

import heapq
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbatch.scheduling.policies import AdmissionLimits, FcfsPriority, PriorityPolicy, QueuePolicy, Router
from agentbatch.scheduling.registry import make_priority, make_queue, make_router
from agentbatch.scheduling.types import SampleProgress, StepKind, StepTicket, WorkerLoad
from agentbatch.sim.model import EngineModel, SimRequest
from agentbatch.sim.profiles import EngineProfile, get_profile
from agentbatch.traces.schema import ENVIRONMENT, INFERENCE, Trace, TraceSample

_FRESH_BASE = 1 << 60  # token ids unique to one sample's context (never shared)
_ZEROS = array("q", bytes(8 * 4096))

# event kinds, ordered by phase within an instant
_ENV_END = 0
_ITER_END = 0
_ITER_START = 1


@dataclass
class PolicySpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class VirtualConfig:
    """What a virtual replay runs with. Policy names are the registry's (scheduling/registry.py)."""

    workers: int = 2
    profile: str | EngineProfile = "llama3-8b-h100"
    profile_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"max_num_seqs": 64}
    max_active: int = 64  # samples admitted at once (reference concurrency)
    env_slots: int = 16
    per_worker_inflight: int | None = None  # requests in flight per worker; None = the profile's max_num_seqs
    coupled: bool = False
    router: PolicySpec = field(default_factory=lambda: PolicySpec("round_robin"))
    env_queue: PolicySpec = field(default_factory=lambda: PolicySpec("fifo"))
    inference_queue: PolicySpec = field(default_factory=lambda: PolicySpec("fifo"))
    priority: PolicySpec = field(default_factory=lambda: PolicySpec("fcfs"))
    env_time_scale: float = 1.0
    priors: dict[str, float] | None = None  # task id -> expected chain steps (history-aware CAAS)
    # Admission order: "trace" (recorded order) or "longest_prior_first" (samples with the longest
    # prior chain are admitted first, LPT-style; samples without a prior keep their order, last).
    admission_order: str = "trace"

    def engine_profile(self) -> EngineProfile:
        return get_profile(self.profile, **self.profile_overrides)

    def limits(self, profile: EngineProfile) -> AdmissionLimits:
        return AdmissionLimits(
            max_active_samples=self.max_active,
            env_slots=self.env_slots,
            per_worker_inflight=self.per_worker_inflight or profile.max_num_seqs,
            coupled=self.coupled,
        )


class _Sample:
    __slots__ = ("trace", "prog", "pos", "ctx", "admitted_at", "finished_at", "slot")

    def __init__(self, trace: TraceSample, prog: SampleProgress) -> None:
        self.trace = trace
        self.prog = prog
        self.pos = 0  # index into trace.steps of the next step
        self.ctx = array("q")  # token ids of the context; int64, 8 bytes a token (lists take ~36)
        self.admitted_at = 0.0
        self.finished_at: float | None = None
        self.slot: str | None = None  # coupled mode: the environment slot held while admitted


@dataclass
class RawResult:
    steps: list[tuple]  # STEP_FIELDS rows
    samples: list[tuple]  # SAMPLE_FIELDS rows
    makespan_s: float
    events: int
    engine_metrics: dict[str, dict[str, float]]
    router_counters: dict[str, int]
    aged_pops: int


STEP_FIELDS = (
    "sample_id", "index", "kind", "enqueued_at", "started_at", "finished_at", "worker", "prompt_tokens",
    "cached_prompt_tokens", "recomputed_tokens", "output_tokens", "prefill_s", "decode_s", "engine_queue_s",
    "preemptions",
)  # fmt: skip
SAMPLE_FIELDS = ("index", "task_id", "steps_done", "score", "admitted_at", "finished_at", "last_worker")


def _default_engine_factory(profile: EngineProfile, name: str, policy: str) -> Any:
    return EngineModel(profile, name=name, policy=policy)


EngineFactory = Callable[[EngineProfile, str, str], Any]


class VirtualBatch:
    """One simulated batch. `run()` once; it returns the raw step and sample records."""

    def __init__(self, trace: Trace, config: VirtualConfig, engine_factory: EngineFactory | None = None) -> None:
        self._SimRequest = SimRequest
        self.trace = trace
        self.cfg = config
        self.profile = config.engine_profile()
        self.limits = config.limits(self.profile)
        self.router: Router = make_router(config.router.name, **config.router.params)
        self._want_kv = getattr(self.router, "kv_margin", None) is not None
        self.env_queue: QueuePolicy = make_queue(config.env_queue.name, **config.env_queue.params)
        self.priority: PriorityPolicy = make_priority(config.priority.name, **config.priority.params)
        engine_policy = "fcfs" if isinstance(self.priority, FcfsPriority) else "priority"
        factory = engine_factory or _default_engine_factory
        self.names = [f"sim-{i}" for i in range(config.workers)]
        self.engines = [factory(self.profile, n, engine_policy) for n in self.names]
        self.queues: list[QueuePolicy] = [
            make_queue(config.inference_queue.name, **config.inference_queue.params) for _ in self.names
        ]
        self.loads = [WorkerLoad(name=n, capacity=self.limits.per_worker_inflight) for n in self.names]
        self.inflight = [0] * config.workers
        self.busy = [False] * config.workers
        self._index = {n: i for i, n in enumerate(self.names)}
        self._heap: list[tuple] = []
        self._seq = 0
        self._fresh = _FRESH_BASE
        self._shared: dict[str, list[int]] = {}
        self._requests: dict[str, tuple[_Sample, StepTicket, float, int]] = {}
        self._steps: list[tuple] = []
        self._free_slots: list[str] = [f"env-{k}" for k in reversed(range(config.env_slots))]
        self._active = 0
        self._admitted = 0
        self._events = 0
        priors = config.priors or {}
        self._pending: deque[_Sample] = deque(
            _Sample(s, SampleProgress(sample_id=s.index, task_id=s.task_id, arrival_seq=0,
                                      prior_chain_steps=priors.get(s.task_id)))
            for s in trace.samples
        )  # fmt: skip
        self._all = list(self._pending)
        if config.admission_order == "longest_prior_first":
            order = sorted(self._all, key=lambda x: (x.prog.prior_chain_steps is None,
                                                     -(x.prog.prior_chain_steps or 0.0), x.trace.index))
            self._pending = deque(order)
        elif config.admission_order != "trace":
            raise ValueError(f"admission_order must be 'trace' or 'longest_prior_first', got {config.admission_order!r}")

    # --- event heap ----------------------------------------------------------------------------
    def _push(self, t: float, phase: int, kind: str, arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, phase, self._seq, kind, arg))

    # --- admission -----------------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        limit = self.limits.effective_active()
        while self._pending and self._active < limit:
            s = self._pending.popleft()
            self._active += 1
            s.prog.arrival_seq = self._admitted
            self._admitted += 1
            s.admitted_at = now
            if self.limits.coupled:
                s.slot = self._free_slots.pop()
            self._advance(s, now)

    def _finish(self, s: _Sample, now: float) -> None:
        s.finished_at = now
        s.ctx = array("q")  # free the context
        for engine in self.engines:  # drop the engines' per-sample prompt memo
            forget = getattr(engine, "forget_sample", None)
            if forget is not None:
                forget(s.trace.index)
        self._active -= 1
        if s.slot is not None:
            self._free_slots.append(s.slot)
            s.slot = None
        self._admit(now)

    def _advance(self, s: _Sample, now: float) -> None:
        steps = s.trace.steps
        if s.pos >= len(steps):
            self._finish(s, now)
            return
        st = steps[s.pos]
        if st.kind == INFERENCE:
            self._enqueue_inference(s, now)
        else:
            self._enqueue_env(s, now)

    # --- inference -----------------------------------------------------------------------------
    def _prompt(self, s: _Sample, length: int) -> array:
        ctx = s.ctx
        if not ctx and s.trace.shared_prefix_tokens:
            group = s.trace.prefix_group
            shared = self._shared.get(group)
            if shared is None or len(shared) < s.trace.shared_prefix_tokens:
                base = (zlib.crc32(group.encode()) + 1) << 24
                shared = array("q", range(base, base + s.trace.shared_prefix_tokens))
                self._shared[group] = shared
            ctx.extend(shared[: s.trace.shared_prefix_tokens])
        if len(ctx) < length:  # observation / template tokens not yet in the context
            self._extend(ctx, length - len(ctx))
        elif len(ctx) > length:  # the agent shortened its context: a new list (see below)
            s.ctx = ctx = ctx[:length]
        # The context list itself is the prompt (no copy). The engine reads it in add_request and
        # keeps it only as its per-sample memo, whose prefix stays valid because a context only
        # grows by appends while it lives; a shortened context is a new list.
        return ctx

    def _extend(self, ctx: array, n: int) -> None:
        # New context tokens: one id unique in the whole batch, then zeros. The engine's block
        # hashes are chained over the prefix, so blocks after a unique token are unique too, and
        # zeros are a memcpy instead of a Python int per token.
        if n <= 0:
            return
        ctx.append(self._fresh)
        self._fresh += 1
        n -= 1
        while n > 0:
            k = min(n, len(_ZEROS))
            ctx.extend(_ZEROS if k == len(_ZEROS) else _ZEROS[:k])
            n -= k

    def _enqueue_inference(self, s: _Sample, now: float) -> None:
        st = s.trace.steps[s.pos]
        ticket = StepTicket(sample=s.prog, kind=StepKind.INFERENCE, step_index=st.index, enqueued_at=now,
                            prompt_tokens=int(st.prompt_tokens or 0), payload=s)  # fmt: skip
        for w, load in enumerate(self.loads):
            load.in_flight = self.inflight[w]
            load.queued = len(self.queues[w])
            if self._want_kv:  # as a live router reads vllm:kv_cache_usage_perc from /metrics
                load.kv_usage = self.engines[w].metrics()["kv_cache_usage_perc"]
        name = self.router.route(ticket, self.loads)
        w = self._index[name]
        ticket.worker = name
        self.queues[w].push(ticket)
        self._dispatch(w, now)

    def _dispatch(self, w: int, now: float) -> None:
        q = self.queues[w]
        engine = self.engines[w]
        cap = self.limits.per_worker_inflight
        while len(q) and self.inflight[w] < cap:
            ticket = q.pop(now)
            s: _Sample = ticket.payload  # type: ignore[assignment]
            st = s.trace.steps[s.pos]
            prio = self.priority.priority(s.prog)
            rid = f"{s.trace.index}:{st.index}"
            out = max(1, int(st.output_tokens or 1))
            req = self._SimRequest(
                request_id=rid, sample_id=s.trace.index, prompt=self._prompt(s, int(st.prompt_tokens or 1)),
                output_tokens=out, priority=0 if prio is None else prio, arrival=now,
            )  # fmt: skip
            engine.add_request(req, now)
            self._requests[rid] = (s, ticket, now, w)
            self.inflight[w] += 1
            if not self.busy[w]:
                self.busy[w] = True
                self._push(now, _ITER_START, "iter_start", w)

    def _iter_start(self, w: int, now: float) -> None:
        engine = self.engines[w]
        if not engine.has_work():
            self.busy[w] = False
            return
        res = engine.run_iteration(now)
        self._push(now + res.duration, _ITER_END, "iter_end", (w, res))

    def _iter_end(self, w: int, res: Any, now: float) -> None:
        for stats in res.finished:
            s, ticket, started, _ = self._requests.pop(stats.request_id)
            self.inflight[w] -= 1
            st = s.trace.steps[s.pos]
            self._steps.append((
                s.trace.index, st.index, INFERENCE, ticket.enqueued_at, started, now, self.names[w],
                stats.prompt_tokens, stats.cached_prompt_tokens, stats.recomputed_tokens, stats.output_tokens,
                stats.prefill_s, stats.decode_s, stats.queue_s, stats.preemptions,
            ))  # fmt: skip
            s.prog.steps_done += 1
            s.prog.attained_s += now - started
            s.prog.last_worker = self.names[w]
            self._extend(s.ctx, stats.output_tokens)
            s.pos += 1
            self._advance(s, now)
        self._dispatch(w, now)
        # Start the next iteration after every other event of this instant (phase order).
        self._push(now, _ITER_START, "iter_start", w)

    # --- environment ---------------------------------------------------------------------------
    def _enqueue_env(self, s: _Sample, now: float) -> None:
        st = s.trace.steps[s.pos]
        ticket = StepTicket(sample=s.prog, kind=StepKind.ENVIRONMENT, step_index=st.index, enqueued_at=now,
                            payload=s)  # fmt: skip
        if s.slot is not None:  # coupled: the sample holds its slot
            self._start_env(ticket, s.slot, now)
            return
        self.env_queue.push(ticket)
        self._dispatch_env(now)

    def _dispatch_env(self, now: float) -> None:
        while self._free_slots and len(self.env_queue):
            ticket = self.env_queue.pop(now)
            self._start_env(ticket, self._free_slots.pop(), now)

    def _start_env(self, ticket: StepTicket, slot: str, now: float) -> None:
        s: _Sample = ticket.payload  # type: ignore[assignment]
        st = s.trace.steps[s.pos]
        d = (st.duration_s or 0.0) * self.cfg.env_time_scale
        self._push(now + d, _ENV_END, "env_end", (ticket, slot, now))

    def _env_end(self, ticket: StepTicket, slot: str, started: float, now: float) -> None:
        s: _Sample = ticket.payload  # type: ignore[assignment]
        st = s.trace.steps[s.pos]
        self._steps.append((s.trace.index, st.index, ENVIRONMENT, ticket.enqueued_at, started, now, slot,
                            None, None, None, None, None, None, None, None))  # fmt: skip
        s.prog.steps_done += 1
        s.prog.attained_s += now - started
        if st.obs_tokens:
            self._extend(s.ctx, st.obs_tokens)
        s.pos += 1
        if s.slot is None:
            self._free_slots.append(slot)
            self._dispatch_env(now)
        if st.done:
            s.pos = len(s.trace.steps)
        self._advance(s, now)

    # --- main loop -----------------------------------------------------------------------------
    def run(self) -> RawResult:
        self._admit(0.0)
        heap = self._heap
        now = 0.0
        while heap:
            now, _, _, kind, arg = heapq.heappop(heap)
            self._events += 1
            if kind == "iter_start":
                self._iter_start(arg, now)
            elif kind == "iter_end":
                self._iter_end(arg[0], arg[1], now)
            else:
                self._env_end(arg[0], arg[1], arg[2], now)
        unfinished = [s.trace.index for s in self._all if s.finished_at is None]
        if unfinished:
            raise RuntimeError(f"simulation stalled: {len(unfinished)} samples never finished (first {unfinished[:5]})")
        samples = [
            (s.trace.index, s.trace.task_id, s.prog.steps_done, s.trace.score, s.admitted_at, s.finished_at,
             s.prog.last_worker)
            for s in self._all
        ]  # fmt: skip
        counters = getattr(self.router, "counters", None)
        return RawResult(
            steps=self._steps,
            samples=samples,
            makespan_s=max((s.finished_at or 0.0) for s in self._all) if self._all else 0.0,
            events=self._events,
            engine_metrics={n: dict(e.metrics()) for n, e in zip(self.names, self.engines, strict=True)},
            router_counters={k: getattr(counters, k) for k in ("first", "sticky", "moved")} if counters else {},
            aged_pops=int(getattr(self.env_queue, "aged_pops", 0)),
        )
