"""Recurrent-state memory of a hybrid model: one slot per running sequence, and a pool of saved
states (checkpoints) at block boundaries that prefix reuse needs.

A checkpoint is keyed by the chained hash of the block it ends; the pool holds `checkpoints`
entries and evicts the least recently used (like vLLM `--mamba-cache-mode align` / SGLang's mamba
radix cache, but sized apart from the KV pool). A dense model (`slots is None`) has neither.
"""

from __future__ import annotations

from collections import OrderedDict


class StatePool:
    __slots__ = ("slots", "free_slots", "checkpoints", "_ckpt")

    def __init__(self, slots: int | None, checkpoints: int) -> None:
        self.slots = slots
        self.free_slots = slots if slots is not None else 0
        self.checkpoints = checkpoints
        self._ckpt: OrderedDict[int, None] = OrderedDict()

    @property
    def hybrid(self) -> bool:
        return self.slots is not None

    @property
    def saves_checkpoints(self) -> bool:
        return self.slots is not None and self.checkpoints > 0

    def take_slot(self) -> None:
        self.free_slots -= 1

    def release_slot(self) -> None:
        self.free_slots += 1

    def save(self, block_hash: int) -> None:
        """Save (or refresh) the state at the block with this hash."""
        ck = self._ckpt
        if block_hash in ck:
            ck.move_to_end(block_hash)
            return
        ck[block_hash] = None
        if len(ck) > self.checkpoints:
            ck.popitem(last=False)

    def cut(self, hashes: list[int], blocks: int, touch: bool = True) -> int:
        """Deepest block <= `blocks` with a saved state (hybrid prefix reuse needs one)."""
        ck = self._ckpt
        for j in range(blocks, 0, -1):
            if hashes[j - 1] in ck:
                if touch:
                    ck.move_to_end(hashes[j - 1])
                return j
        return 0
