"""What goes into and out of the engine model, and its per-request bookkeeping.

`SimRequest` in, `IterationResult` / `RequestStats` out (public); `EngineRequest` is the model's own
record of a request, shared by the request queue, the block pool and the step logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentbatch.sim.block_pool import JunkRun, PrefixNode


@dataclass
class SimRequest:
    request_id: str
    sample_id: int
    # token ids (agentbatch.protocols.tokens), a list or an array('q'); the engine keeps a
    # reference to each sample's last prompt: pass a new object per turn or grow the same one by
    # appends, never shorten or rewrite it in place
    prompt: Sequence[int]
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


# Request states.
WAITING, PREFILL, DECODE, DONE = range(4)


class EngineRequest:
    """A request inside the engine: where it is, what it holds, what it has cost."""

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
        self.state = WAITING
        self.num_computed = 0
        self.num_tokens = self.prompt_len  # known tokens: prompt + sampled so far
        self.gen = 0
        self.node: PrefixNode | None = None  # deepest held tree node
        self.tree_blocks = 0  # blocks held through the tree (a prefix of the sequence)
        self.private = 0  # blocks held outside the tree (partial block, generated tokens)
        self.junk: JunkRun | None = None  # generated-token blocks left by a preemption
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


@dataclass(slots=True)
class ScheduledChunk:
    """Prefill work given to a request in one step. `version` tells whether the request was
    preempted later in the same step (then the chunk is void)."""

    req: EngineRequest
    tokens: int
    version: int
    attention_pairs: int  # (query, key) pairs of the chunk's causal attention


@dataclass(slots=True)
class PrefixHit:
    """What an admission finds cached: `blocks` through the prefix tree, `junk` generated-token
    blocks kept from the request's own preemption; `cap` is the most blocks a hit may cover."""

    cap: int
    blocks: int
    junk: int

    @property
    def total(self) -> int:
        return self.blocks + self.junk


@dataclass
class EngineModelTotals:
    """One simulated engine's cumulative totals since it started, exported by serve-sim as its
    Prometheus counters (`/metrics`, vLLM names)."""

    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    num_preemptions_total: int = 0
    recomputed_tokens_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefill_tokens_total: int = 0
    iterations_total: int = 0
    busy_s_total: float = 0.0
    requests_finished_total: int = 0
