"""BlockPool: the paged KV cache's blocks, with reference counts and an LRU of free ones.

A block whose reference count drops to zero goes to the tail of the free queue but keeps
its content hash, so a later request with the same prefix can take it back (a prefix-cache
hit). Allocation takes from the head of the queue (least recently freed) and only then
forgets the block's hash: that is the LRU eviction of cached blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVBlock:
    """One physical KV block: its id, how many requests use it, and its content hash if full."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """Owns every KV block; hands them out, takes them back, and indexes full ones by hash."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody references (some may still hold cached content)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Full blocks indexed by content hash (in use or free)."""
        return len(self._cached)

    def usage(self) -> float:
        """Fraction of blocks referenced by a live request, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, n: int) -> list[KVBlock]:
        """Take `n` free blocks (evicting their cached content); raises if fewer are free."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Add a reference to each block (a prefix-cache hit), taking free ones off the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop a reference to each block; unreferenced ones join the free queue's tail in order."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of KV block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def free_unused(self, blocks: list[KVBlock]) -> None:
        """Give back blocks that were reserved but hold nothing worth keeping (a rejected
        speculative lookahead): they go to the head of the free queue, to be taken first."""
        for block in reversed(blocks):
            if block.ref_cnt != 1 or block.block_hash is not None:
                raise RuntimeError(f"KV block {block.block_id} is shared or cached, not unused")
            block.ref_cnt = 0
            self._free[block.block_id] = block
            self._free.move_to_end(block.block_id, last=False)

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Index a full block by its content hash; a hash already indexed keeps its first block."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        """The cached block with this content hash, if any."""
        return self._cached.get(block_hash)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no block is in use."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
            self.num_evictions += 1
