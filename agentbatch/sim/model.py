"""A pure model of one LLM inference engine worker, after vLLM V1's scheduler and KV cache manager.

No I/O, no clock, no asyncio: the caller owns time. It adds requests at a time `now`, then calls
`run_iteration(now)` while `has_work()`; each call schedules one engine step (one forward pass) and
returns its duration; the caller calls again at `now + duration`. The discrete-event replay drives it
in virtual time, `sim_timing.SimulatedTiming` in real time.

What is modelled (vLLM V1 semantics unless said otherwise):
- Continuous batching with a token budget per step (`max_num_batched_tokens`), at most
  `max_num_seqs` running sequences, chunked prefill. Decode first: every running decoding sequence
  gets its one token, then running partial prefills in admission order, then waiting requests.
  No new request is admitted in a step that preempted one.
- Paged KV cache of `num_kv_blocks` blocks of `block_size` tokens with prefix caching: full blocks
  are identified by a hash chained over the block's tokens and its parent's hash; only full blocks
  are cached; a hit is a whole number of blocks and never covers the last prompt token (it is always
  computed, to produce the first output token). Blocks are cached as soon as they are scheduled, so
  a second request with the same prefix in the same or a later step hits them.
- Unreferenced cached blocks stay in the cache and count as free; allocation evicts them in LRU
  order of release, a sequence's tail blocks before its head (vLLM's free-block queue). The cache is
  kept as a tree of runs of blocks, so the work per request is per run, not per block; a prefix
  block is never evicted before its descendants (as in SGLang's radix cache; in vLLM such orphaned
  blocks could never be hit anyway).
- Output tokens are not known to the model, so blocks filled by generated tokens get hashes private
  to the request: they occupy the cache like vLLM's, and only the same request hits them again
  (when it resumes after a preemption); the next turn of a sample hits the previous prompt's blocks.
- Preemption when a step cannot get blocks: the newest running request (policy "fcfs") or the one
  with the largest (priority, arrival) (policy "priority") frees its blocks and goes back to the
  front of the waiting queue; on resume it looks up the prefix cache again and recomputes the rest.
- Hybrid models (profile.state_slots set): a running sequence holds one recurrent-state slot; when
  all slots are taken, waiting requests queue (head of line). Prefix reuse needs both the KV blocks
  and a saved state at the hit boundary: a state checkpoint is saved at the last full prompt block
  reached by each prefill chunk, into a pool of `state_checkpoints` entries with LRU eviction (like
  vLLM `--mamba-cache-mode align` / SGLang's mamba radix cache, but with the checkpoint pool sized
  apart from the KV pool). A hit is cut back to the deepest block that has a checkpoint.
- `recomputed_tokens` of a request counts tokens this worker had computed before and computes again:
  after a preemption (tokens below the request's high-water mark not served from cache) and, for a
  sample's later turn, blocks of its previous prompt that were evicted since.

The parts, as in vLLM v1: the waiting queue (`request_queue`), the KV block pool with its prefix
tree (`block_pool`), the recurrent-state pool (`state_pool`), the prompts' block hashes
(`prompt_hashes`) and this module's step logic; they share the request record and the small
dataclasses of `requests`.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from agentbatch.sim.block_pool import BlockPool
from agentbatch.sim.profiles import EngineProfile
from agentbatch.sim.prompt_hashes import PromptHasher
from agentbatch.sim.request_queue import POLICIES, create_request_queue
from agentbatch.sim.requests import (
    DECODE,
    DONE,
    PREFILL,
    WAITING,
    EngineModelTotals,
    EngineRequest,
    IterationResult,
    PrefixHit,
    RequestStats,
    ScheduledChunk,
    SimRequest,
)
from agentbatch.sim.state_pool import StatePool

__all__ = ["EngineModel", "IterationResult", "RequestStats", "SimRequest"]


@dataclass(slots=True)
class _StepPlan:
    """What one engine step has scheduled so far: its prefill chunks, the token budget left, and the
    requests it preempted (a step that preempted admits nobody)."""

    budget: int = 0
    scheduled: list[ScheduledChunk] = field(default_factory=list)
    preempted: int = 0


class EngineModel:
    def __init__(
        self, profile: EngineProfile, name: str = "sim-0", policy: str = "fcfs", memo_limit: int = 65536
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}; expected 'fcfs' or 'priority'")
        self.profile = profile
        self.name = name
        self.policy = policy
        self.bs = profile.block_size
        self._cost = profile.cost
        self._seq = itertools.count()
        self._iter = 0
        # requests
        self._waiting = create_request_queue(policy)
        self._decode: set[EngineRequest] = set()
        self._prefill: list[EngineRequest] = []  # running partial prefills, admission order
        self._decode_ctx_base = 0  # sum over decoding seqs of (base_computed - base_iter + 1)
        # decoding requests finish at known steps: (iteration, seq, version, request)
        self._events: list[tuple[int, int, int, EngineRequest]] = []
        # decoding requests need a new block every block_size steps: grouped by step modulo block_size,
        # so a step finds those that need one without looking at the others
        self._due: list[set[EngineRequest]] = [set() for _ in range(profile.block_size)]
        self._alloc_iter = -1
        self._planned: list[float] = []  # durations of the iterations plan_decodes planned
        self._plan_iter = 0  # the iteration the plan starts at
        self._live: dict[str, EngineRequest] = {}  # request id -> request, until it finishes
        # memory
        self._blocks = BlockPool(profile.num_kv_blocks, profile.block_size, profile.enable_prefix_caching)
        self._states = StatePool(profile.state_slots, profile.state_checkpoints)
        self._hasher = PromptHasher(profile.block_size, memo_limit)
        self.counters = EngineModelTotals()

    # --- public API ------------------------------------------------------------------------------
    def add_request(self, req: SimRequest, now: float) -> None:
        """Queue a request; it can be scheduled from the next iteration on."""
        if req.request_id in self._live:
            raise ValueError(f"{self.name}: request id {req.request_id!r} is already in the engine")
        need = -(-(len(req.prompt) + max(1, req.output_tokens)) // self.bs)
        if need > self.profile.num_kv_blocks or not req.prompt:
            raise ValueError(
                f"{self.name}: request {req.request_id} needs {need} KV blocks (prompt {len(req.prompt)} + "
                f"output {req.output_tokens} tokens); the worker has {self.profile.num_kv_blocks}"
                if req.prompt
                else f"{self.name}: request {req.request_id} has an empty prompt"
            )
        blocks = self._hasher.hash_prompt(req.sample_id, req.prompt)
        r = EngineRequest(req, blocks.hashes, blocks.common, now, next(self._seq))
        self._live[r.rid] = r
        self._waiting.push(r)

    def abort_request(self, request_id: str) -> bool:
        """Drop a request (a client went away), freeing what it holds; False if it is not here."""
        r = self._live.pop(request_id, None)
        if r is None:
            return False
        if r.state == WAITING:
            self._waiting.remove(r)
            r.junk = None  # its blocks stay evictable
        else:
            if r.state == DECODE:
                self._leave_decode(r, self._iter)
            else:
                self._prefill.remove(r)
            self._release(r, keep_junk=False)
        r.state = DONE
        r.version += 1
        return True

    def has_work(self) -> bool:
        return bool(self._decode or self._prefill or len(self._waiting))

    def run_iteration(self, now: float) -> IterationResult:
        """Schedule one engine step at `now` and return its duration and the requests that finish
        at `now + duration`."""
        it = self._iter
        step = _StepPlan(preempted=self._grow_decodes(it))
        self._alloc_iter = it  # from here on, this step's decode blocks are taken
        step.budget = self.profile.max_num_batched_tokens - len(self._decode)
        self._continue_prefills(it, step)
        if not step.preempted:  # no admission in a step that preempted, like vLLM
            self._admit_waiting(now, step)
        scheduled = step.scheduled

        # the cost of the step
        prefill_tokens = pairs = 0
        for c in scheduled:
            if c.version == c.req.version:  # not preempted later in this step
                prefill_tokens += c.tokens
                pairs += c.attention_pairs
        n_decode = len(self._decode)
        attended = self._decode_ctx_base + n_decode * it if n_decode else 0
        if prefill_tokens or n_decode:
            duration = self._cost.iteration_time(prefill_tokens, n_decode, attended, pairs)
        else:
            duration = self._cost.c0  # an empty step (everything was preempted)
        end = now + duration

        # apply it
        finished: list[RequestStats] = []
        generated = n_decode + self._apply_prefills(scheduled, it, end, finished)
        self._finish_decodes(it, end, finished)
        totals = self.counters
        totals.generation_tokens_total += generated
        totals.prefill_tokens_total += prefill_tokens
        totals.iterations_total += 1
        totals.busy_s_total += duration
        self._iter = it + 1
        return IterationResult(duration, finished, prefill_tokens, n_decode, attended, step.preempted)

    def plan_decodes(self, now: float, limit: int) -> list[float]:
        """The start times of the next iterations (at most `limit`) that only decode and change
        nothing anyone else sees, as `run_iteration` would run them from `now`, and after them the
        start of the one that follows; nothing is applied until `commit_decodes`. Such an iteration
        prefills nothing (nothing waits or prefills), finishes no request and grows its sequences
        without a preemption. Its duration is the float `run_iteration` computes (the cost model's
        sum with the prefill terms zero), so a driver that runs them without an event each gets the
        same results."""
        starts = [now]
        durations: list[float] = []
        self._planned = durations
        self._plan_iter = self._iter
        if self._prefill or len(self._waiting) or not self._decode:
            return starts
        events, due, bs, n = self._events, self._due, self.bs, len(self._decode)
        cost = self._cost
        fixed = cost.c0 + cost.c_decode * n  # iteration_time(0, n, attended, 0) less its attention term
        moe = cost.moe_weight_s * (1.0 - (1.0 - cost.moe_active_frac) ** n) if cost.moe_weight_s else 0.0
        c_attn, base, free, it = cost.c_attn, self._decode_ctx_base, self._blocks.free(), self._iter
        while len(durations) < limit and not (events and events[0][0] <= it):  # none finishes in it
            free -= len(due[it % bs])
            if free < 0:
                break  # a preemption: the full step logic
            d = fixed + c_attn * (base + n * it)
            if moe:
                d += moe
            durations.append(d)
            now = now + d
            starts.append(now)
            it += 1
        return starts

    def commit_decodes(self, count: int) -> None:
        """Apply the first `count` iterations the last `plan_decodes` planned and not yet applied
        (the engine has not changed otherwise since)."""
        c, due, bs, n = self.counters, self._due, self.bs, len(self._decode)
        planned, done = self._planned, self._iter - self._plan_iter
        for d in planned[done:done + count]:
            it = self._iter
            grow = len(due[it % bs])
            if grow:
                ok = self._blocks.alloc(grow)
                assert ok
            self._alloc_iter = it
            c.generation_tokens_total += n
            c.iterations_total += 1
            c.busy_s_total += d
            self._iter = it + 1

    def metrics(self) -> dict[str, float]:
        c = self.counters
        blocks = self._blocks
        return {
            "prefix_cache_queries_total": float(c.prefix_cache_queries_total),
            "prefix_cache_hits_total": float(c.prefix_cache_hits_total),
            "kv_cache_usage_perc": blocks.used() / self.profile.num_kv_blocks,
            "num_requests_running": float(len(self._decode) + len(self._prefill)),
            "num_requests_waiting": float(len(self._waiting)),
            "num_preemptions_total": float(c.num_preemptions_total),
            "recomputed_tokens_total": float(c.recomputed_tokens_total),
            "prompt_tokens_total": float(c.prompt_tokens_total),
            "generation_tokens_total": float(c.generation_tokens_total),
            "prefill_tokens_total": float(c.prefill_tokens_total),
            "evicted_blocks_total": float(blocks.evicted_blocks_total),
            "cached_blocks": float(blocks.cached()),
            "iterations_total": float(c.iterations_total),
            "busy_s_total": c.busy_s_total,
            "requests_finished_total": float(c.requests_finished_total),
            "state_slots_free": float(self._states.free_slots) if self._states.hybrid else 0.0,
        }

    def kv_cache_usage(self) -> float:
        """metrics()["kv_cache_usage_perc"] without building the dict (routers ask per decision)."""
        return self._blocks.used() / self.profile.num_kv_blocks

    def holds_prefix(self, sample_id: int) -> int:
        """Tokens of `sample_id`'s last prompt (on this worker) that a new request would find cached."""
        memo = self._hasher.memo(sample_id)
        if memo is None:
            return 0
        blocks = self._blocks.match_len(memo.hashes, min(len(memo.hashes), (memo.length - 1) // self.bs))
        if self._states.hybrid:
            blocks = self._states.cut(memo.hashes, blocks, touch=False)
        return blocks * self.bs

    def forget_sample(self, sample_id: int) -> None:
        """Drop the per-sample memo (a finished sample): frees its prompt reference."""
        self._hasher.forget(sample_id)

    # --- the steps of one iteration --------------------------------------------------------------
    def _grow_decodes(self, it: int) -> int:
        """Decoding sequences that cross a block boundary this step need one more block each;
        preempt (newest / lowest priority first) until they fit. Returns the preemptions."""
        due = self._due[it % self.bs]
        preempted = 0
        if not due:
            return 0
        if len(due) > self._blocks.free():
            while due and len(due) > self._blocks.free():
                self._preempt(self._victim(), it)
                preempted += 1
        if due:
            ok = self._blocks.alloc(len(due))
            assert ok
        return preempted

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens of a prefill chunk: what is left, within the step's budget and the long-prefill cap."""
        n = min(remaining, budget)
        thr = self.profile.long_prefill_token_threshold
        return min(n, thr) if thr > 0 else n

    def _schedule(self, r: EngineRequest, n: int, step: _StepPlan) -> None:
        self._blocks.insert(r, r.num_computed + n)
        step.scheduled.append(ScheduledChunk(r, n, r.version, n * r.num_computed + n * (n + 1) // 2))
        step.budget -= n

    def _continue_prefills(self, it: int, step: _StepPlan) -> None:
        """Running partial prefills continue, in admission order."""
        for r in list(self._prefill) if self._prefill else ():
            if step.budget <= 0:
                break
            if r.state != PREFILL:
                continue
            n = self._chunk(r.num_tokens - r.num_computed, step.budget)
            need = -(-(r.num_computed + n) // self.bs) - (r.tree_blocks + r.private)
            while need > 0 and not self._blocks.alloc(need):
                victim = self._victim()
                self._preempt(victim, it)
                step.preempted += 1
                if victim is r:
                    return
            if need > 0:
                r.private += need
            self._schedule(r, n, step)

    def _admit_waiting(self, now: float, step: _StepPlan) -> None:
        max_seqs = self.profile.max_num_seqs
        states = self._states
        while step.budget > 0 and len(self._decode) + len(self._prefill) < max_seqs:
            r = self._waiting.peek()
            if r is None:
                break
            if states.hybrid and states.free_slots <= 0:
                break  # the state pool is full: the request waits for a slot
            if not self._admit(r, step.budget, now):
                break
            self._waiting.pop()
            self._schedule(r, self._chunk(r.num_tokens - r.num_computed, step.budget), step)

    def _apply_prefills(self, scheduled: list[ScheduledChunk], it: int, end: float,
                        finished: list[RequestStats]) -> int:
        """Prefill progress and first tokens of the step's chunks; returns the tokens sampled."""
        generated = 0
        for c in scheduled:
            r = c.req
            if c.version != r.version or r.state != PREFILL:
                continue
            p = r.num_computed
            if r.high_water > p:
                self._add_recompute(r, min(p + c.tokens, r.high_water) - p)
            r.num_computed = p + c.tokens
            self._checkpoint(r)
            if r.num_computed < r.num_tokens:
                continue
            # the chunk reached the end of the known tokens: sample one token
            r.gen += 1
            r.num_tokens += 1
            generated += 1
            if r.first_token is None:
                r.first_token = end
                self.counters.prompt_tokens_total += r.prompt_len
            self._prefill.remove(r)
            if r.gen >= r.out:
                finished.append(self._finish(r, end))
            else:
                self._enter_decode(r, it + 1)
        return generated

    def _finish_decodes(self, it: int, end: float, finished: list[RequestStats]) -> None:
        ev = self._events
        while ev and ev[0][0] <= it:
            _, _, ver, r = heapq.heappop(ev)
            if ver != r.version or r.state != DECODE:
                continue
            self._leave_decode(r, it + 1)
            r.gen = r.out
            r.num_tokens = r.prompt_len + r.gen
            finished.append(self._finish(r, end))

    # --- admission, preemption, finishing ----------------------------------------------------------
    def _lookup(self, r: EngineRequest) -> PrefixHit:
        """What the caches hold for r now; changes nothing but the checkpoints' LRU order."""
        cap = (r.num_tokens - 1) // self.bs  # never cache-hit the last known token
        hit = 0
        if self.profile.enable_prefix_caching:
            hit = self._blocks.match_len(r.hashes, min(cap, r.nhash))
            if self._states.hybrid:
                hit = self._states.cut(r.hashes, hit)
        # generated-token blocks kept from a preemption extend a full prompt hit (dense models)
        junk = 0
        run = r.junk
        if run is not None and run.alive and hit == r.nhash and not self._states.hybrid:
            junk = min(run.blocks, cap - hit)
        return PrefixHit(cap, hit, junk)

    def _admit(self, r: EngineRequest, budget: int, now: float) -> bool:
        """Look up the prefix cache and allocate the first chunk; False leaves r waiting untouched."""
        hit = self._lookup(r)
        start = hit.total * self.bs
        n = self._chunk(r.num_tokens - start, budget)
        need = -(-(start + n) // self.bs) - hit.total
        if need + hit.junk + self._blocks.unreferenced_on_path(r.hashes, hit.blocks) > self._blocks.free():
            return False
        self._blocks.take_prefix(r, hit.blocks, hit.junk, need)
        r.num_computed = start
        if not r.looked_up:
            self._count_lookup(r, hit)
        if self._states.hybrid:
            self._states.take_slot()
            r.has_slot = True
        r.state = PREFILL
        r.run_seq = next(self._seq)
        if r.first_sched is None:
            r.first_sched = now
        self._prefill.append(r)
        return True

    def _count_lookup(self, r: EngineRequest, hit: PrefixHit) -> None:
        """Prefix-cache counters of a request's first lookup, and the blocks of the sample's
        previous prompt lost since (recomputed)."""
        r.looked_up = True
        r.cached = hit.blocks * self.bs
        c = self.counters
        c.prefix_cache_queries_total += r.prompt_len
        c.prefix_cache_hits_total += hit.blocks * self.bs
        lost = min(r.prev_common, hit.cap) - hit.blocks
        if lost > 0:
            self._add_recompute(r, lost * self.bs)

    def _victim(self) -> EngineRequest:
        running = itertools.chain(self._decode, self._prefill)
        if self.policy == "priority":
            return max(running, key=lambda q: (q.priority, q.arrival, q.seq))
        return max(running, key=lambda q: q.run_seq)

    def _preempt(self, r: EngineRequest, it: int) -> None:
        if r.state == DECODE:
            self._leave_decode(r, it, it + 1 if self._alloc_iter == it else it)
        else:
            self._prefill.remove(r)
        r.high_water = max(r.high_water, r.num_computed)
        self._release(r, keep_junk=True)
        r.num_computed = 0
        r.state = WAITING
        r.version += 1
        r.preemptions += 1
        self.counters.num_preemptions_total += 1
        self._waiting.push(r, front=True)

    def _finish(self, r: EngineRequest, end: float) -> RequestStats:
        self._release(r, keep_junk=False)
        r.state = DONE
        r.version += 1
        self._live.pop(r.rid, None)
        self.counters.requests_finished_total += 1
        first_sched = r.first_sched if r.first_sched is not None else end
        first_token = r.first_token if r.first_token is not None else end
        return RequestStats(
            request_id=r.rid,
            sample_id=r.sample_id,
            arrival=r.arrival,
            first_scheduled=first_sched,
            finished=end,
            queue_s=first_sched - r.arrival,
            prefill_s=first_token - first_sched,
            decode_s=end - first_token,
            prompt_tokens=r.prompt_len,
            cached_prompt_tokens=r.cached,
            recomputed_tokens=r.recomputed,
            output_tokens=r.gen,
            preemptions=r.preemptions,
            first_token=first_token,
            worker=self.name,
        )

    def _release(self, r: EngineRequest, keep_junk: bool) -> None:
        """Free a request's blocks and state slot; a preempted request keeps a handle on its
        generated-token blocks (`keep_junk`)."""
        run = self._blocks.release(r)
        if run is not None and keep_junk:
            r.junk = run
        if r.has_slot:
            self._states.release_slot()
            r.has_slot = False

    def _enter_decode(self, r: EngineRequest, base_iter: int) -> None:
        r.state = DECODE
        r.base_iter = base_iter
        r.base_computed = r.num_computed
        r.gen_at_base = r.gen
        r.private_base = r.private
        self._decode.add(r)
        self._decode_ctx_base += r.base_computed - base_iter + 1
        r.finish_iter = f = base_iter + (r.out - r.gen) - 1
        heapq.heappush(self._events, (f, next(self._seq), r.version, r))
        # step base_iter + k computes position base_computed + k: a new block when that is a multiple
        # of block_size beyond the blocks held
        r.first_block_iter = b = base_iter + (r.tree_blocks + r.private) * self.bs - r.base_computed
        if b <= f:
            self._due[b % self.bs].add(r)

    def _leave_decode(self, r: EngineRequest, at_iter: int, blocks_upto: int | None = None) -> None:
        """Bring a decoding request's lazy counters up to the start of step `at_iter` (its blocks
        up to `blocks_upto`, when the step already gave it its block)."""
        done = at_iter - r.base_iter
        r.num_computed = r.base_computed + done
        r.gen = r.gen_at_base + done
        r.num_tokens = r.prompt_len + r.gen
        r.private = r.private_base + self._blocks_taken(r, at_iter if blocks_upto is None else blocks_upto)
        self._decode.discard(r)
        self._due[r.first_block_iter % self.bs].discard(r)
        self._decode_ctx_base -= r.base_computed - r.base_iter + 1
        r.version += 1

    def _blocks_taken(self, r: EngineRequest, at_iter: int) -> int:
        """Blocks a decoding request took in steps [base_iter, at_iter)."""
        last = min(at_iter, r.finish_iter + 1)
        b = r.first_block_iter
        return 0 if last <= b else (last - b - 1) // self.bs + 1

    def _add_recompute(self, r: EngineRequest, tokens: int) -> None:
        if tokens > 0:
            r.recomputed += tokens
            self.counters.recomputed_tokens_total += tokens

    def _checkpoint(self, r: EngineRequest) -> None:
        """Hybrid models save the recurrent state at the last full prompt block a chunk reached."""
        if not self._states.saves_checkpoints:
            return
        idx = min(r.num_computed // self.bs, r.nhash) - 1
        if idx >= 0:
            self._states.save(r.hashes[idx])

    # --- self-check (tests) ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Recount blocks from the tree and the running requests; raise AssertionError on a mismatch."""
        running = list(self._decode) + self._prefill
        private = sum(r.private for r in self._prefill)
        private += sum(r.private_base + self._blocks_taken(r, self._iter) for r in self._decode)
        self._blocks.check(private)
        if self._states.hybrid:
            assert self._states.free_slots + len(running) == self._states.slots
        assert len(running) <= self.profile.max_num_seqs
