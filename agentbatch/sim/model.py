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
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from agentbatch.sim.profiles import EngineProfile

_ROOT_HASH = 0x5EED_CAFE


@dataclass
class SimRequest:
    request_id: str
    sample_id: int
    # token ids (agentbatch.protocols.tokens), a list or an array('q'); the engine keeps a
    # reference to each sample's last prompt: pass a new object per turn or grow the same one by
    # appends, never shorten or rewrite it in place
    prompt: list[int]
    output_tokens: int
    priority: int = 0
    arrival: float = 0.0  # informational; the model uses the `now` of add_request


@dataclass
class RequestStats:
    request_id: str
    sample_id: int
    arrival: float
    first_scheduled: float
    finished: float
    queue_s: float  # arrival -> first scheduled
    prefill_s: float  # first scheduled -> first output token
    decode_s: float  # first output token -> last output token
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens served from the prefix cache at first scheduling
    recomputed_tokens: int
    output_tokens: int
    preemptions: int
    first_token: float = 0.0  # time of the first output token
    worker: str = ""


@dataclass
class IterationResult:
    duration: float
    finished: list[RequestStats]
    prefill_tokens: int
    decode_seqs: int
    attended_tokens: int = 0  # context tokens read by decoding sequences
    preempted: int = 0  # requests preempted in this step


# --- the prefix cache: a tree of runs of full blocks -----------------------------------------------


class _Node:
    """A run of consecutive cached blocks of one hash chain; children keyed by their first hash.
    `ref` counts running requests whose held prefix covers this whole run."""

    __slots__ = ("hashes", "parent", "children", "ref", "last_used", "alive", "key")

    def __init__(self, hashes: list[int], parent: _Node | None, ref: int = 0) -> None:
        self.hashes = hashes
        self.key = hashes[0] if hashes else 0  # our entry in parent.children
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.ref = ref
        self.last_used = 0
        self.alive = True


class _Junk:
    """Blocks of generated tokens freed by a request: evictable, reachable only by that request."""

    __slots__ = ("blocks", "last_used", "alive")

    def __init__(self, blocks: int, last_used: int) -> None:
        self.blocks = blocks
        self.last_used = last_used
        self.alive = True


_WAITING, _PREFILL, _DECODE, _DONE = range(4)


def _extend_hashes(hashes: list[int], prompt, start: int, nfull: int, bs: int) -> None:
    """Append the chained hashes of full blocks start..nfull-1 of `prompt` (a list or array of ids).

    The blocks' tokens are hashed as 64-bit bytes (one C-level conversion of the new part, then a
    bytes slice per block): several times faster than hashing tuples of Python ints. Only equality
    of hashes matters to the model, so their values (which vary with PYTHONHASHSEED) never change
    its behaviour.
    """
    h = hashes[-1] if hashes else _ROOT_HASH
    part = prompt[start * bs : nfull * bs]
    try:  # the same tokens give the same bytes whatever the container (list, array of any int type)
        raw = (part if isinstance(part, array) and part.typecode == "q" else array("q", part)).tobytes()
    except (OverflowError, TypeError):  # ids beyond 64 bits: hash the tokens themselves
        for i in range(nfull - start):
            h = hash((h, tuple(part[i * bs : (i + 1) * bs])))
            hashes.append(h)
        return
    step = bs * 8
    for off in range(0, len(raw), step):
        h = hash((h, raw[off : off + step]))
        hashes.append(h)


class _Req:
    __slots__ = (
        "rid", "sample_id", "prompt_len", "hashes", "nhash", "out", "priority", "arrival", "seq", "run_seq",
        "state", "num_computed", "num_tokens", "gen", "node", "tree_blocks", "private", "junk",
        "has_slot", "base_iter", "base_computed", "gen_at_base", "version", "high_water",
        "first_sched", "first_token", "cached", "recomputed", "preemptions", "looked_up",
        "prev_common", "no_insert", "finish_iter", "first_block_iter", "private_base",
    )  # fmt: skip

    def __init__(self, req: SimRequest, hashes: list[int], prev_common: int, now: float, seq: int) -> None:
        self.rid = req.request_id
        self.sample_id = req.sample_id
        self.prompt_len = len(req.prompt)
        # hashes of the prompt's full blocks: the first `nhash` entries (the list may be the sample's
        # memo, which later turns extend in place)
        self.hashes = hashes
        self.nhash = len(hashes)
        self.out = max(1, int(req.output_tokens))  # an engine always samples at least one token
        self.priority = int(req.priority or 0)
        self.arrival = now
        self.seq = seq
        self.run_seq = 0
        self.state = _WAITING
        self.num_computed = 0
        self.num_tokens = self.prompt_len  # known tokens: prompt + sampled so far
        self.gen = 0
        self.node: _Node | None = None  # deepest held tree node
        self.tree_blocks = 0  # blocks held through the tree (a prefix of the sequence)
        self.private = 0  # blocks held outside the tree (partial block, generated tokens)
        self.junk: _Junk | None = None  # generated-token blocks left by a preemption
        self.has_slot = False
        self.base_iter = 0
        self.base_computed = 0
        self.gen_at_base = 0
        self.version = 0
        self.high_water = 0
        self.first_sched: float | None = None
        self.first_token: float | None = None
        self.cached = 0
        self.recomputed = 0
        self.preemptions = 0
        self.looked_up = False
        self.prev_common = prev_common  # full blocks shared with this sample's previous prompt
        self.no_insert = False
        self.finish_iter = 0
        self.first_block_iter = 0  # first decode step that needs a new block (then every block_size)
        self.private_base = 0  # private blocks when decoding began


@dataclass
class _SampleMemo:
    prompt: list[int]
    length: int
    hashes: list[int]


@dataclass
class _Counters:
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    num_preemptions_total: int = 0
    recomputed_tokens_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefill_tokens_total: int = 0
    evicted_blocks_total: int = 0
    iterations_total: int = 0
    busy_s_total: float = 0.0
    requests_finished_total: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class EngineModel:
    def __init__(
        self, profile: EngineProfile, name: str = "sim-0", policy: str = "fcfs", memo_limit: int = 65536
    ) -> None:
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}; expected 'fcfs' or 'priority'")
        self.profile = profile
        self.name = name
        self.policy = policy
        self.bs = profile.block_size
        self._cost = profile.cost
        self._seq = itertools.count()
        self._iter = 0
        self._tick = 0  # release order, for LRU
        # requests
        self._waiting_fcfs: deque[_Req] = deque()
        self._waiting_heap: list[tuple[int, float, int, _Req]] = []
        self._decode: set[_Req] = set()
        self._prefill: list[_Req] = []  # running partial prefills, admission order
        self._decode_ctx_base = 0  # sum over decoding seqs of (base_computed - base_iter + 1)
        # decoding requests finish at known steps: (iteration, seq, version, request)
        self._events: list[tuple[int, int, int, _Req]] = []
        # decoding requests need a new block every block_size steps: grouped by step modulo block_size,
        # so a step finds those that need one without looking at the others
        self._due: list[set[_Req]] = [set() for _ in range(profile.block_size)]
        self._alloc_iter = -1
        self._live: dict[str, _Req] = {}  # request id -> request, until it finishes
        # memory
        self._root = _Node([], None)
        self._tree_blocks = 0  # blocks held by tree nodes
        self._ref_blocks = 0  # tree blocks in referenced nodes
        self._junk_blocks = 0
        self._private_blocks = 0
        self._evictable: list[tuple[int, int, object]] = []  # (last_used, seq, node|junk)
        self._evict_batch = profile.num_kv_blocks // 256
        self._free_slots = profile.state_slots if profile.state_slots is not None else 0
        self._ckpt: OrderedDict[int, None] = OrderedDict()
        self._memo: dict[int, _SampleMemo] = {}  # per sample, least recently used first
        self._memo_limit = memo_limit
        self._by_first_block: OrderedDict[int, _SampleMemo] = OrderedDict()  # recent prompts, LRU
        self.counters = _Counters()

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
        hashes, common = self._hash_prompt(req.sample_id, req.prompt)
        r = _Req(req, hashes, common, now, next(self._seq))
        self._live[r.rid] = r
        self._push_waiting(r)

    def abort_request(self, request_id: str) -> bool:
        """Drop a request (a client went away), freeing what it holds; False if it is not here."""
        r = self._live.pop(request_id, None)
        if r is None:
            return False
        if r.state == _WAITING:
            if self.policy == "priority":
                self._waiting_heap = [e for e in self._waiting_heap if e[3] is not r]
                heapq.heapify(self._waiting_heap)
            else:
                self._waiting_fcfs.remove(r)
            if r.junk is not None:
                r.junk = None  # its blocks stay evictable
        else:
            if r.state == _DECODE:
                self._leave_decode(r, self._iter)
            else:
                self._prefill.remove(r)
            self._release(r, keep_junk_for=None)
        r.state = _DONE
        r.version += 1
        return True

    def has_work(self) -> bool:
        return bool(self._decode or self._prefill or self._waiting_fcfs or self._waiting_heap)

    def run_iteration(self, now: float) -> IterationResult:
        """Schedule one engine step at `now` and return its duration and the requests that finish
        at `now + duration`."""
        it = self._iter
        bs = self.bs
        budget = self.profile.max_num_batched_tokens
        preempted = 0
        scheduled: list[tuple[_Req, int, int, int]] = []  # (req, tokens, version, attention pairs)

        # 1. Decoding sequences that cross a block boundary this step need one more block each.
        due = self._due[it % bs]
        if due:
            need = len(due)
            if need > self._free():
                # not enough memory: preempt (newest / lowest priority first) until the rest fit
                while due and len(due) > self._free():
                    self._preempt(self._victim(), it)
                    preempted += 1
                need = len(due)
            if need:
                ok = self._alloc(need)
                assert ok
        self._alloc_iter = it  # from here on, this step's decode blocks are taken
        budget -= len(self._decode)

        # 2. Running partial prefills continue, in admission order.
        thr = self.profile.long_prefill_token_threshold
        for r in list(self._prefill) if self._prefill else ():
            if budget <= 0:
                break
            if r.state != _PREFILL:
                continue
            n = min(r.num_tokens - r.num_computed, budget)
            if thr > 0:
                n = min(n, thr)
            need = -(-(r.num_computed + n) // bs) - (r.tree_blocks + r.private)
            ok = True
            while need > 0 and not self._alloc(need):
                victim = self._victim()
                self._preempt(victim, it)
                preempted += 1
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            if need > 0:
                r.private += need
            self._insert_blocks(r, r.num_computed + n)
            scheduled.append((r, n, r.version, n * r.num_computed + n * (n + 1) // 2))
            budget -= n

        # 3. Admit waiting requests (not in a step that preempted, like vLLM).
        if not preempted:
            max_seqs = self.profile.max_num_seqs
            hybrid = self.profile.state_slots is not None
            while budget > 0 and len(self._decode) + len(self._prefill) < max_seqs:
                r = self._peek_waiting()
                if r is None:
                    break
                if hybrid and self._free_slots <= 0:
                    break  # the state pool is full: the request waits for a slot
                if not self._admit(r, budget, now):
                    break
                self._pop_waiting()
                n = min(r.num_tokens - r.num_computed, budget)
                if thr > 0:
                    n = min(n, thr)
                self._insert_blocks(r, r.num_computed + n)
                scheduled.append((r, n, r.version, n * r.num_computed + n * (n + 1) // 2))
                budget -= n

        # 4. Cost of the step.
        prefill_tokens = pairs = 0
        for r, n, ver, q in scheduled:
            if ver == r.version:  # not preempted later in this step
                prefill_tokens += n
                pairs += q
        n_decode = len(self._decode)
        attended = self._decode_ctx_base + n_decode * it if n_decode else 0
        if prefill_tokens or n_decode:
            duration = self._cost.iteration_time(prefill_tokens, n_decode, attended, pairs)
        else:
            duration = self._cost.c0  # an empty step (everything was preempted)
        end = now + duration

        # 5. Apply the step: prefill progress, first tokens, finishes.
        finished: list[RequestStats] = []
        generated = n_decode
        for r, n, ver, _ in scheduled:
            if ver != r.version or r.state != _PREFILL:
                continue
            p = r.num_computed
            if r.high_water > p:
                self._add_recompute(r, min(p + n, r.high_water) - p)
            r.num_computed = p + n
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
        ev = self._events
        while ev and ev[0][0] <= it:
            _, _, ver, r = heapq.heappop(ev)
            if ver != r.version or r.state != _DECODE:
                continue
            self._leave_decode(r, it + 1)
            r.gen = r.out
            r.num_tokens = r.prompt_len + r.gen
            finished.append(self._finish(r, end))

        c = self.counters
        c.generation_tokens_total += generated
        c.prefill_tokens_total += prefill_tokens
        c.iterations_total += 1
        c.busy_s_total += duration
        self._iter = it + 1
        return IterationResult(duration, finished, prefill_tokens, n_decode, attended, preempted)

    def metrics(self) -> dict[str, float]:
        c = self.counters
        total = self.profile.num_kv_blocks
        used = self._ref_blocks + self._private_blocks
        return {
            "prefix_cache_queries_total": float(c.prefix_cache_queries_total),
            "prefix_cache_hits_total": float(c.prefix_cache_hits_total),
            "kv_cache_usage_perc": used / total,
            "num_requests_running": float(len(self._decode) + len(self._prefill)),
            "num_requests_waiting": float(len(self._waiting_fcfs) + len(self._waiting_heap)),
            "num_preemptions_total": float(c.num_preemptions_total),
            "recomputed_tokens_total": float(c.recomputed_tokens_total),
            "prompt_tokens_total": float(c.prompt_tokens_total),
            "generation_tokens_total": float(c.generation_tokens_total),
            "prefill_tokens_total": float(c.prefill_tokens_total),
            "evicted_blocks_total": float(c.evicted_blocks_total),
            "cached_blocks": float(self._tree_blocks + self._junk_blocks),
            "iterations_total": float(c.iterations_total),
            "busy_s_total": c.busy_s_total,
            "requests_finished_total": float(c.requests_finished_total),
            "state_slots_free": float(self._free_slots) if self.profile.state_slots is not None else 0.0,
        }

    def kv_cache_usage(self) -> float:
        """metrics()["kv_cache_usage_perc"] without building the dict (routers ask per decision)."""
        return (self._ref_blocks + self._private_blocks) / self.profile.num_kv_blocks

    def holds_prefix(self, sample_id: int) -> int:
        """Tokens of `sample_id`'s last prompt (on this worker) that a new request would find cached."""
        memo = self._memo.get(sample_id)
        if memo is None:
            return 0
        blocks = self._match_len(memo.hashes, min(len(memo.hashes), (memo.length - 1) // self.bs))
        if self.profile.state_slots is not None:
            blocks = self._ckpt_cut(memo.hashes, blocks, touch=False)
        return blocks * self.bs

    @property
    def num_running(self) -> int:
        return len(self._decode) + len(self._prefill)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting_fcfs) + len(self._waiting_heap)

    def forget_sample(self, sample_id: int) -> None:
        """Drop the per-sample memo (a finished sample): frees its prompt reference."""
        self._memo.pop(sample_id, None)

    # --- hashing ---------------------------------------------------------------------------------
    def _hash_prompt(self, sample_id: int, prompt: list[int]) -> tuple[list[int], int]:
        """Block hashes of the prompt's full blocks. Reuses the hashes of the sample's previous prompt
        for their common prefix (agent turns extend the previous prompt), or, for a sample new to
        this worker, those of a recent prompt with the same first block (a shared system prompt).
        Returns (hashes, blocks in common with the sample's previous prompt)."""
        bs = self.bs
        nfull = len(prompt) // bs
        memo = self._memo.get(sample_id)
        common = 0
        if memo is not None:
            common = self._common_blocks(prompt, memo, nfull)
            # extend the memo's list in place when the whole previous prompt is shared (requests
            # holding it read only their first `nhash` entries)
            hashes = memo.hashes if common == len(memo.hashes) else memo.hashes[:common]
        else:
            hashes = []
            if nfull:
                _extend_hashes(hashes, prompt, 0, 1, bs)
                other = self._by_first_block.get(hashes[0])
                if other is not None:
                    shared = self._common_blocks(prompt, other, nfull)
                    if shared > 1:
                        hashes = other.hashes[:shared]  # a copy: the other sample extends its own
        start = len(hashes)
        if start < nfull:
            _extend_hashes(hashes, prompt, start, nfull, bs)
        new_memo = _SampleMemo(prompt, len(prompt), hashes)
        memos = self._memo
        memos.pop(sample_id, None)
        memos[sample_id] = new_memo
        if len(memos) > self._memo_limit:  # bound the memory of long live runs
            del memos[next(iter(memos))]
        if hashes:
            fb = self._by_first_block
            fb[hashes[0]] = new_memo
            fb.move_to_end(hashes[0])
            if len(fb) > 64:
                fb.popitem(last=False)
        return hashes, common

    def _common_blocks(self, prompt, memo: _SampleMemo, nfull: int) -> int:
        """Full blocks `prompt` shares with `memo`'s prompt (token comparisons in C)."""
        m = min(nfull, len(memo.hashes))
        if not m:
            return 0
        old = memo.prompt
        if prompt is old:
            return m  # the same context, grown by appends
        if len(prompt) >= memo.length and prompt[: memo.length] == old[: memo.length]:
            return m  # the usual agent turn: the new prompt extends the previous one
        bs = self.bs
        lo, hi = 0, m  # largest k with equal first k blocks (equality is prefix-closed)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if prompt[: mid * bs] == old[: mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # --- waiting queue ---------------------------------------------------------------------------
    def _push_waiting(self, r: _Req, front: bool = False) -> None:
        if self.policy == "priority":
            heapq.heappush(self._waiting_heap, (r.priority, r.arrival, r.seq, r))
        elif front:
            self._waiting_fcfs.appendleft(r)
        else:
            self._waiting_fcfs.append(r)

    def _peek_waiting(self) -> _Req | None:
        if self.policy == "priority":
            return self._waiting_heap[0][3] if self._waiting_heap else None
        return self._waiting_fcfs[0] if self._waiting_fcfs else None

    def _pop_waiting(self) -> None:
        if self.policy == "priority":
            heapq.heappop(self._waiting_heap)
        else:
            self._waiting_fcfs.popleft()

    # --- admission, preemption, finishing ----------------------------------------------------------
    def _admit(self, r: _Req, budget: int, now: float) -> bool:
        """Look up the prefix cache and allocate the first chunk; False leaves r waiting untouched."""
        bs = self.bs
        cap = (r.num_tokens - 1) // bs  # never cache-hit the last known token
        hit = 0
        if self.profile.enable_prefix_caching:
            hit = self._match_len(r.hashes, min(cap, r.nhash))
            if self.profile.state_slots is not None:
                hit = self._ckpt_cut(r.hashes, hit)
        # generated-token blocks kept from a preemption extend a full prompt hit (dense models)
        extra = 0
        junk = r.junk
        if junk is not None and junk.alive and hit == r.nhash and self.profile.state_slots is None:
            extra = min(junk.blocks, cap - hit)
        n = min(r.num_tokens - (hit + extra) * bs, budget)
        thr = self.profile.long_prefill_token_threshold
        if thr > 0:
            n = min(n, thr)
        need = -(-((hit + extra) * bs + n) // bs) - (hit + extra)
        if need + extra + self._unreferenced_on_path(r.hashes, hit) > self._free():
            return False
        # commit
        node = self._descend(r.hashes, hit)
        self._acquire(node)
        r.node = node
        r.tree_blocks = hit
        if junk is not None:
            if extra:  # the head of the run becomes the request's again; the rest stays evictable
                junk.blocks -= extra
                self._junk_blocks -= extra
                if junk.blocks <= 0:
                    junk.alive = False
            r.junk = None
        r.private = extra
        self._private_blocks += extra
        if need > 0:
            ok = self._alloc(need)
            assert ok
            r.private += need
        r.num_computed = (hit + extra) * bs
        if not r.looked_up:
            r.looked_up = True
            r.cached = hit * bs
            c = self.counters
            c.prefix_cache_queries_total += r.prompt_len
            c.prefix_cache_hits_total += hit * bs
            lost = min(r.prev_common, cap) - hit
            if lost > 0:
                self._add_recompute(r, lost * bs)
        if self.profile.state_slots is not None:
            self._free_slots -= 1
            r.has_slot = True
        r.state = _PREFILL
        r.run_seq = next(self._seq)
        if r.first_sched is None:
            r.first_sched = now
        self._prefill.append(r)
        return True

    def _victim(self) -> _Req:
        running = itertools.chain(self._decode, self._prefill)
        if self.policy == "priority":
            return max(running, key=lambda q: (q.priority, q.arrival, q.seq))
        return max(running, key=lambda q: q.run_seq)

    def _preempt(self, r: _Req, it: int) -> None:
        if r.state == _DECODE:
            self._leave_decode(r, it, it + 1 if self._alloc_iter == it else it)
        else:
            self._prefill.remove(r)
        r.high_water = max(r.high_water, r.num_computed)
        self._release(r, keep_junk_for=r)
        r.num_computed = 0
        r.state = _WAITING
        r.version += 1
        r.preemptions += 1
        self.counters.num_preemptions_total += 1
        self._push_waiting(r, front=True)

    def _finish(self, r: _Req, end: float) -> RequestStats:
        self._release(r, keep_junk_for=None)
        r.state = _DONE
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

    def _release(self, r: _Req, keep_junk_for: _Req | None) -> None:
        """Free a request's blocks: tree blocks become evictable, generated-token blocks become junk."""
        self._tick += 1
        full = r.num_computed // self.bs
        junk_blocks = max(0, min(full, r.tree_blocks + r.private) - r.tree_blocks)
        self._private_blocks -= r.private
        if junk_blocks:
            j = _Junk(junk_blocks, self._tick)
            self._junk_blocks += junk_blocks
            heapq.heappush(self._evictable, (self._tick, next(self._seq), j))
            if keep_junk_for is not None:
                keep_junk_for.junk = j
        if r.node is not None:
            self._unref(r.node)
        r.node = None
        r.tree_blocks = 0
        r.private = 0
        if r.has_slot:
            self._free_slots += 1
            r.has_slot = False

    def _enter_decode(self, r: _Req, base_iter: int) -> None:
        r.state = _DECODE
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

    def _leave_decode(self, r: _Req, at_iter: int, blocks_upto: int | None = None) -> None:
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

    def _blocks_taken(self, r: _Req, at_iter: int) -> int:
        """Blocks a decoding request took in steps [base_iter, at_iter)."""
        last = min(at_iter, r.finish_iter + 1)
        b = r.first_block_iter
        return 0 if last <= b else (last - b - 1) // self.bs + 1

    def _add_recompute(self, r: _Req, tokens: int) -> None:
        if tokens > 0:
            r.recomputed += tokens
            self.counters.recomputed_tokens_total += tokens

    # --- memory ----------------------------------------------------------------------------------
    def _free(self) -> int:
        """Blocks free in vLLM's sense: never used, or cached but unreferenced (evictable)."""
        return self.profile.num_kv_blocks - self._ref_blocks - self._private_blocks

    def _alloc(self, n: int) -> bool:
        """Take n blocks for a request's private use (the caller adds them to it), evicting LRU."""
        if n > self._free():
            return False
        fresh = self.profile.num_kv_blocks - self._tree_blocks - self._junk_blocks - self._private_blocks
        if n > fresh:
            # Evict a little ahead (1/256 of the cache, the least recently used blocks) so that the
            # one-block allocations of decoding sequences do not each walk the LRU heap; caches of
            # up to 256 blocks evict exactly what is needed.
            self._evict(max(n - fresh, min(self._evict_batch, self._free() - fresh)))
        self._private_blocks += n
        return True

    def _evict(self, need: int) -> None:
        heap = self._evictable
        while need > 0:
            last_used, _, item = heapq.heappop(heap)
            if isinstance(item, _Junk):
                if not item.alive or item.last_used != last_used:
                    continue
                m = min(need, item.blocks)
                item.blocks -= m
                self._junk_blocks -= m
                if item.blocks:
                    heapq.heappush(heap, (last_used, next(self._seq), item))
                else:
                    item.alive = False
            else:
                node: _Node = item  # type: ignore[assignment]
                if not node.alive or node.ref or node.children or node.last_used != last_used:
                    continue
                m = min(need, len(node.hashes))
                del node.hashes[len(node.hashes) - m :]
                self._tree_blocks -= m
                if node.hashes:
                    heapq.heappush(heap, (last_used, next(self._seq), node))
                else:
                    self._drop_node(node)
            need -= m
            self.counters.evicted_blocks_total += m

    def _drop_node(self, node: _Node) -> None:
        node.alive = False
        parent = node.parent
        assert parent is not None
        if parent.children.get(node.key) is node:
            del parent.children[node.key]
        if parent is not self._root and not parent.children and parent.ref == 0:
            heapq.heappush(self._evictable, (parent.last_used, next(self._seq), parent))

    def _match_len(self, hashes: list[int], limit: int) -> int:
        """Full blocks of `hashes` (up to `limit`) present in the cache; does not change it."""
        node = self._root
        pos = 0
        while pos < limit:
            child = node.children.get(hashes[pos])
            if child is None:
                break
            run = child.hashes
            end = min(pos + len(run), limit)
            # chained hashes: equal at the last block of the span means equal all along it
            if hashes[end - 1] == run[end - pos - 1]:
                if end - pos < len(run):
                    return end
                pos = end
                node = child
                continue
            return pos + self._common(hashes, pos, run, end - pos)
        return pos

    @staticmethod
    def _common(hashes: list[int], pos: int, run: list[int], n: int) -> int:
        # chained hashes: equality is prefix-closed, so binary search the first mismatch
        lo, hi = 1, n  # run[0] matches (it was the child key)
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[pos + mid] == run[mid]:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _descend(self, hashes: list[int], blocks: int) -> _Node:
        """The node ending exactly at `blocks` along `hashes` (splitting a run if needed)."""
        node = self._root
        pos = 0
        while pos < blocks:
            child = node.children[hashes[pos]]
            take = len(child.hashes)
            if pos + take > blocks:
                child = self._split(child, blocks - pos)
                take = blocks - pos
            node = child
            pos += take
        return node

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut `node` after k blocks; returns the new head (the tail keeps the node's identity, so
        requests holding it stay valid)."""
        parent = node.parent
        assert parent is not None
        head = _Node(node.hashes[:k], parent, node.ref)
        head.last_used = node.last_used
        del node.hashes[:k]
        node.key = node.hashes[0]
        parent.children[head.hashes[0]] = head
        head.children[node.hashes[0]] = node
        node.parent = head
        return head

    def _unreferenced_on_path(self, hashes: list[int], blocks: int) -> int:
        """Blocks of the cached prefix that are unreferenced now (a hit takes them out of the free count)."""
        if blocks == 0:
            return 0
        node = self._root
        pos = 0
        total = 0
        while pos < blocks:
            child = node.children[hashes[pos]]
            take = min(len(child.hashes), blocks - pos)
            if child.ref == 0:
                total += take
            node = child
            pos += take
        return total

    def _acquire(self, node: _Node) -> None:
        while node is not self._root:
            if node.ref == 0:
                self._ref_blocks += len(node.hashes)
            node.ref += 1
            node = node.parent  # type: ignore[assignment]

    def _unref(self, node: _Node) -> None:
        tick = self._tick
        while node is not self._root:
            node.ref -= 1
            if node.ref == 0:
                self._ref_blocks -= len(node.hashes)
                node.last_used = tick
                if not node.children:
                    heapq.heappush(self._evictable, (tick, next(self._seq), node))
            node = node.parent  # type: ignore[assignment]

    def _insert_blocks(self, r: _Req, upto_tokens: int) -> None:
        """Cache r's prompt blocks that will be full once `upto_tokens` are computed."""
        if r.no_insert or not self.profile.enable_prefix_caching:
            return
        end = min(upto_tokens // self.bs, r.nhash)
        start = r.tree_blocks
        if end <= start:
            return
        m = end - start
        if r.private < m:  # cannot happen: the blocks were allocated before
            return
        new = r.hashes[start:end]
        node = r.node if r.node is not None else self._root
        if node is not self._root and node.ref == 1 and not node.children:
            node.hashes.extend(new)  # the request's own leaf grows in place
        else:
            if new[0] in node.children:
                # Someone cached (some of) the same blocks meanwhile: r switches to the cached copies
                # (its own are freed) and caching goes on after them, its later blocks hanging below
                # (giving up here would leave r's later blocks, and a hybrid model's state
                # checkpoints on them, out of the cache for good; vLLM caches them too).
                k = self._match_len(r.hashes, end) - start
                target = self._descend(r.hashes, start + k)
                n = target
                while n is not node:
                    if n.ref == 0:
                        self._ref_blocks += len(n.hashes)
                    n.ref += 1
                    n = n.parent  # type: ignore[assignment]
                r.node = target
                r.tree_blocks = start + k
                r.private -= k
                self._private_blocks -= k
                if k < m:
                    self._insert_blocks(r, upto_tokens)
                return
            child = _Node(new, node, 0)
            node.children[new[0]] = child
            child.ref = 1
            # `node` keeps its refs; the new child is referenced by r only
            r.node = child
        self._tree_blocks += m
        self._ref_blocks += m
        r.tree_blocks = end
        r.private -= m
        self._private_blocks -= m

    # --- hybrid state checkpoints ----------------------------------------------------------------
    def _checkpoint(self, r: _Req) -> None:
        if self.profile.state_slots is None or self.profile.state_checkpoints <= 0:
            return
        idx = min(r.num_computed // self.bs, r.nhash) - 1
        if idx < 0:
            return
        h = r.hashes[idx]
        ck = self._ckpt
        if h in ck:
            ck.move_to_end(h)
            return
        ck[h] = None
        if len(ck) > self.profile.state_checkpoints:
            ck.popitem(last=False)

    def _ckpt_cut(self, hashes: list[int], blocks: int, touch: bool = True) -> int:
        """Deepest block <= `blocks` with a saved state (hybrid prefix reuse needs one)."""
        ck = self._ckpt
        for j in range(blocks, 0, -1):
            if hashes[j - 1] in ck:
                if touch:
                    ck.move_to_end(hashes[j - 1])
                return j
        return 0

    # --- self-check (tests) ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Recount blocks from the tree and the running requests; raise AssertionError on a mismatch."""
        tree = ref = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.alive and child.parent is node and child.key == key == child.hashes[0]
                assert child.ref <= node.ref or node is self._root, "a child is held more than its parent"
                tree += len(child.hashes)
                ref += len(child.hashes) if child.ref else 0
                stack.append(child)
        running = list(self._decode) + self._prefill
        private = sum(r.private for r in self._prefill)
        private += sum(r.private_base + self._blocks_taken(r, self._iter) for r in self._decode)
        assert tree == self._tree_blocks, (tree, self._tree_blocks)
        assert ref == self._ref_blocks, (ref, self._ref_blocks)
        assert private == self._private_blocks, (private, self._private_blocks)
        assert 0 <= self._junk_blocks
        assert self._tree_blocks + self._junk_blocks + self._private_blocks <= self.profile.num_kv_blocks
        if self.profile.state_slots is not None:
            assert self._free_slots + len(running) == self.profile.state_slots
        assert len(running) <= self.profile.max_num_seqs
