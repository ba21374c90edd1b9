"""Paged KV memory of one engine worker: the block accounting and the prefix cache (after vLLM v1's
block_pool.py / kv_cache_manager.py).

Full prompt blocks live in a tree of runs of blocks keyed by chained hashes (`PrefixNode`);
generated-token blocks freed by a preempted request are a `JunkRun` only that request can reuse.
Unreferenced cached blocks count as free; allocation evicts them in LRU order of release, a run's
tail before its head, and a prefix block never before its descendants.

Blocks are counted in four kinds: tree (cached prompt blocks; `ref_blocks` of them held by running
requests), junk, and private (held by one request outside the tree: its partial block and
generated tokens). free = total - referenced tree - private.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentbatch.sim.requests import EngineRequest


class PrefixNode:
    """A run of consecutive cached blocks of one hash chain; children keyed by their first hash.
    `ref` counts running requests whose held prefix covers this whole run."""

    __slots__ = ("hashes", "parent", "children", "ref", "last_used", "alive", "key")

    def __init__(self, hashes: list[int], parent: PrefixNode | None, ref: int = 0) -> None:
        self.hashes = hashes
        self.key = hashes[0] if hashes else 0  # our entry in parent.children
        self.parent = parent
        self.children: dict[int, PrefixNode] = {}
        self.ref = ref
        self.last_used = 0
        self.alive = True


class JunkRun:
    """Blocks of generated tokens freed by a request: evictable, reachable only by that request."""

    __slots__ = ("blocks", "last_used", "alive")

    def __init__(self, blocks: int, last_used: int) -> None:
        self.blocks = blocks
        self.last_used = last_used
        self.alive = True


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.bs = block_size
        self.caching = caching
        self.root = PrefixNode([], None)
        self.tree_blocks = 0  # blocks held by tree nodes
        self.ref_blocks = 0  # tree blocks in referenced nodes
        self.junk_blocks = 0
        self.private_blocks = 0
        self.evicted_blocks_total = 0
        self._evictable: list[tuple[int, int, PrefixNode | JunkRun]] = []  # (last_used, seq, item)
        self._evict_batch = num_blocks // 256
        self._seq = itertools.count()
        self._tick = 0  # release order, for LRU

    # --- counting --------------------------------------------------------------------------------
    def free(self) -> int:
        """Blocks free in vLLM's sense: never used, or cached but unreferenced (evictable)."""
        return self.num_blocks - self.ref_blocks - self.private_blocks

    def used(self) -> int:
        return self.ref_blocks + self.private_blocks

    def cached(self) -> int:
        return self.tree_blocks + self.junk_blocks

    # --- allocation and eviction -----------------------------------------------------------------
    def alloc(self, n: int) -> bool:
        """Take n blocks for a request's private use (the caller adds them to it), evicting LRU."""
        if n > self.free():
            return False
        fresh = self.num_blocks - self.tree_blocks - self.junk_blocks - self.private_blocks
        if n > fresh:
            # Evict a little ahead (1/256 of the cache, the least recently used blocks) so that the
            # one-block allocations of decoding sequences do not each walk the LRU heap; caches of
            # up to 256 blocks evict exactly what is needed.
            self._evict(max(n - fresh, min(self._evict_batch, self.free() - fresh)))
        self.private_blocks += n
        return True

    def _evict(self, need: int) -> None:
        heap = self._evictable
        while need > 0:
            last_used, _, item = heapq.heappop(heap)
            if isinstance(item, JunkRun):
                m = self._evict_junk(item, last_used, need)
            else:
                m = self._evict_node(item, last_used, need)
            need -= m
            self.evicted_blocks_total += m

    def _evict_junk(self, item: JunkRun, last_used: int, need: int) -> int:
        if not item.alive or item.last_used != last_used:
            return 0  # a stale heap entry
        m = min(need, item.blocks)
        item.blocks -= m
        self.junk_blocks -= m
        if item.blocks:
            heapq.heappush(self._evictable, (last_used, next(self._seq), item))
        else:
            item.alive = False
        return m

    def _evict_node(self, node: PrefixNode, last_used: int, need: int) -> int:
        if not node.alive or node.ref or node.children or node.last_used != last_used:
            return 0  # stale: held again, grown a child, or released again since
        m = min(need, len(node.hashes))
        del node.hashes[len(node.hashes) - m :]
        self.tree_blocks -= m
        if node.hashes:
            heapq.heappush(self._evictable, (last_used, next(self._seq), node))
        else:
            self._drop_node(node)
        return m

    def _drop_node(self, node: PrefixNode) -> None:
        node.alive = False
        parent = node.parent
        assert parent is not None
        if parent.children.get(node.key) is node:
            del parent.children[node.key]
        if parent is not self.root and not parent.children and parent.ref == 0:
            heapq.heappush(self._evictable, (parent.last_used, next(self._seq), parent))

    # --- looking up the tree ---------------------------------------------------------------------
    def match_len(self, hashes: list[int], limit: int) -> int:
        """Full blocks of `hashes` (up to `limit`) present in the cache; does not change it."""
        node = self.root
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
            return pos + _common(hashes, pos, run, end - pos)
        return pos

    def descend(self, hashes: list[int], blocks: int) -> PrefixNode:
        """The node ending exactly at `blocks` along `hashes` (splitting a run if needed)."""
        node = self.root
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

    def _split(self, node: PrefixNode, k: int) -> PrefixNode:
        """Cut `node` after k blocks; returns the new head (the tail keeps the node's identity, so
        requests holding it stay valid)."""
        parent = node.parent
        assert parent is not None
        head = PrefixNode(node.hashes[:k], parent, node.ref)
        head.last_used = node.last_used
        del node.hashes[:k]
        node.key = node.hashes[0]
        parent.children[head.hashes[0]] = head
        head.children[node.hashes[0]] = node
        node.parent = head
        return head

    def unreferenced_on_path(self, hashes: list[int], blocks: int) -> int:
        """Blocks of the cached prefix that are unreferenced now (a hit takes them out of the free count)."""
        if blocks == 0:
            return 0
        node = self.root
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

    # --- holding and releasing -------------------------------------------------------------------
    def _acquire(self, node: PrefixNode, upto: PrefixNode | None = None) -> None:
        """Reference every node from `node` up to (not including) `upto` (default: the root)."""
        stop = self.root if upto is None else upto
        while node is not stop:
            if node.ref == 0:
                self.ref_blocks += len(node.hashes)
            node.ref += 1
            node = node.parent  # type: ignore[assignment]  # below `stop` (the root or an ancestor) every node has a parent

    def _unref(self, node: PrefixNode) -> None:
        tick = self._tick
        while node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self.ref_blocks -= len(node.hashes)
                node.last_used = tick
                if not node.children:
                    heapq.heappush(self._evictable, (tick, next(self._seq), node))
            node = node.parent  # type: ignore[assignment]  # below `stop` (the root or an ancestor) every node has a parent

    def take_prefix(self, r: EngineRequest, hit: int, junk: int, need: int) -> None:
        """Give `r` the first `hit` cached blocks, `junk` blocks of its own junk run and `need` new ones."""
        node = self.descend(r.hashes, hit)
        self._acquire(node)
        r.node = node
        r.tree_blocks = hit
        run = r.junk
        if run is not None:
            if junk:  # the head of the run becomes the request's again; the rest stays evictable
                run.blocks -= junk
                self.junk_blocks -= junk
                if run.blocks <= 0:
                    run.alive = False
            r.junk = None
        r.private = junk
        self.private_blocks += junk
        if need > 0:
            ok = self.alloc(need)
            assert ok
            r.private += need

    def release(self, r: EngineRequest) -> JunkRun | None:
        """Free a request's blocks: tree blocks become evictable, generated-token blocks a junk run
        (returned, so that a preempted request can find it again)."""
        self._tick += 1
        full = r.num_computed // self.bs
        junk_blocks = max(0, min(full, r.tree_blocks + r.private) - r.tree_blocks)
        self.private_blocks -= r.private
        run = None
        if junk_blocks:
            run = JunkRun(junk_blocks, self._tick)
            self.junk_blocks += junk_blocks
            heapq.heappush(self._evictable, (self._tick, next(self._seq), run))
        if r.node is not None:
            self._unref(r.node)
        r.node = None
        r.tree_blocks = 0
        r.private = 0
        return run

    def insert(self, r: EngineRequest, upto_tokens: int) -> None:
        """Cache r's prompt blocks that will be full once `upto_tokens` are computed."""
        if r.no_insert or not self.caching:
            return
        end = min(upto_tokens // self.bs, r.nhash)
        start = r.tree_blocks
        if end <= start:
            return
        m = end - start
        if r.private < m:  # cannot happen: the blocks were allocated before
            return
        new = r.hashes[start:end]
        node = r.node if r.node is not None else self.root
        if node is not self.root and node.ref == 1 and not node.children:
            node.hashes.extend(new)  # the request's own leaf grows in place
        elif new[0] in node.children:
            self._adopt_cached(r, node, start, end, upto_tokens)
            return
        else:
            child = PrefixNode(new, node, 1)  # referenced by r only; `node` keeps its refs
            node.children[new[0]] = child
            r.node = child
        self.tree_blocks += m
        self.ref_blocks += m
        r.tree_blocks = end
        r.private -= m
        self.private_blocks -= m

    def _adopt_cached(self, r: EngineRequest, node: PrefixNode, start: int, end: int, upto_tokens: int) -> None:
        """Someone cached (some of) the same blocks meanwhile: r switches to the cached copies (its
        own are freed) and caching goes on after them, its later blocks hanging below (giving up
        here would leave r's later blocks, and a hybrid model's state checkpoints on them, out of
        the cache for good; vLLM caches them too)."""
        k = self.match_len(r.hashes, end) - start
        target = self.descend(r.hashes, start + k)
        self._acquire(target, upto=node)
        r.node = target
        r.tree_blocks = start + k
        r.private -= k
        self.private_blocks -= k
        if k < end - start:
            self.insert(r, upto_tokens)

    # --- self-check (tests) ----------------------------------------------------------------------
    def check(self, private: int) -> None:
        """Recount the tree; `private` is the running requests' private blocks, counted by the caller."""
        tree = ref = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.alive and child.parent is node and child.key == key == child.hashes[0]
                assert child.ref <= node.ref or node is self.root, "a child is held more than its parent"
                tree += len(child.hashes)
                ref += len(child.hashes) if child.ref else 0
                stack.append(child)
        assert tree == self.tree_blocks, (tree, self.tree_blocks)
        assert ref == self.ref_blocks, (ref, self.ref_blocks)
        assert private == self.private_blocks, (private, self.private_blocks)
        assert 0 <= self.junk_blocks
        assert self.tree_blocks + self.junk_blocks + self.private_blocks <= self.num_blocks


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
