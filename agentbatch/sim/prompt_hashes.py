"""Chained block hashes of prompts, remembered per sample so that an agent's next turn hashes only
its new blocks.

A full block is identified by a hash chained over its tokens and its parent's hash (vLLM's prefix
cache keys). Only equality of hashes matters to the model, so their values (which vary with
PYTHONHASHSEED) never change its behaviour.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_HASH = 0x5EED_CAFE
_RECENT_FIRST_BLOCKS = 64  # recent prompts kept by first block (shared system prompts)


def extend_hashes(hashes: list[int], prompt: Sequence[int], start: int, nfull: int, bs: int) -> None:
    """Append the chained hashes of full blocks start..nfull-1 of `prompt` (a list or array of ids).

    The blocks' tokens are hashed as 64-bit bytes (one C-level conversion of the new part, then a
    bytes slice per block): several times faster than hashing tuples of Python ints.
    """
    h = hashes[-1] if hashes else ROOT_HASH
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


@dataclass
class SampleMemo:
    prompt: Sequence[int]
    length: int
    hashes: list[int]


@dataclass(slots=True)
class PromptBlocks:
    hashes: list[int]  # chained hashes of the prompt's full blocks
    common: int  # full blocks shared with the sample's previous prompt on this worker


class PromptHasher:
    def __init__(self, block_size: int, memo_limit: int = 65536) -> None:
        self.bs = block_size
        self._memo: dict[int, SampleMemo] = {}  # per sample, least recently used first
        self._memo_limit = memo_limit
        self._by_first_block: OrderedDict[int, SampleMemo] = OrderedDict()  # recent prompts, LRU

    def memo(self, sample_id: int) -> SampleMemo | None:
        return self._memo.get(sample_id)

    def forget(self, sample_id: int) -> None:
        self._memo.pop(sample_id, None)

    def hash_prompt(self, sample_id: int, prompt: Sequence[int]) -> PromptBlocks:
        """Block hashes of the prompt's full blocks. Reuses the hashes of the sample's previous prompt
        for their common prefix (agent turns extend the previous prompt), or, for a sample new to
        this worker, those of a recent prompt with the same first block (a shared system prompt)."""
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
            hashes = self._shared_start(prompt, nfull)
        start = len(hashes)
        if start < nfull:
            extend_hashes(hashes, prompt, start, nfull, bs)
        self._remember(sample_id, SampleMemo(prompt, len(prompt), hashes))
        return PromptBlocks(hashes, common)

    def _shared_start(self, prompt: Sequence[int], nfull: int) -> list[int]:
        """Hashes of the first block, or of the blocks shared with a recent prompt that starts alike."""
        hashes: list[int] = []
        if nfull:
            extend_hashes(hashes, prompt, 0, 1, self.bs)
            other = self._by_first_block.get(hashes[0])
            if other is not None:
                shared = self._common_blocks(prompt, other, nfull)
                if shared > 1:
                    hashes = other.hashes[:shared]  # a copy: the other sample extends its own
        return hashes

    def _remember(self, sample_id: int, new_memo: SampleMemo) -> None:
        memos = self._memo
        memos.pop(sample_id, None)
        memos[sample_id] = new_memo
        if len(memos) > self._memo_limit:  # bound the memory of long live runs
            del memos[next(iter(memos))]
        hashes = new_memo.hashes
        if hashes:
            fb = self._by_first_block
            fb[hashes[0]] = new_memo
            fb.move_to_end(hashes[0])
            if len(fb) > _RECENT_FIRST_BLOCKS:
                fb.popitem(last=False)

    def _common_blocks(self, prompt: Sequence[int], memo: SampleMemo, nfull: int) -> int:
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
