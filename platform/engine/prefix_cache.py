"""Prefix caching: chained content hashes of full KV blocks, and the per-request KV manager.

The hashes (`loraplex.platform.wire.prefix_hash`) fold the model id, the adapter version and
the cache salt into the key of the empty prefix, so two adapters, two versions or two tenants
never map to the same blocks. Because every key commits to its whole prefix, the index is a
tree of blocks: walking a request's keys from the root until the first miss finds its longest
cached prefix. The gateway's router hashes prompts with the same functions to predict it.
"""

from __future__ import annotations

from loraplex.platform.engine.block_pool import BlockPool, KVBlock
from loraplex.platform.engine.request import Request
from loraplex.platform.wire.prefix_hash import hash_block, max_cached_blocks, root_hash


class KVCacheManager:
    """Gives requests KV blocks, finds their cached prefixes, and frees them.

    Counters `queries` and `hits` count prompt tokens looked up and found cached
    (vLLM's prefix_cache_queries / prefix_cache_hits).
    """

    def __init__(
        self, pool: BlockPool, block_size: int, model_id: str, enable_caching: bool = True
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.model_id = model_id
        self.enable_caching = enable_caching
        self._blocks: dict[str, list[KVBlock]] = {}
        self._num_registered: dict[str, int] = {}
        self.queries = 0
        self.hits = 0

    def block_hashes(self, request: Request) -> list[bytes]:
        """Extend and return the request's chained hashes of all its full, known blocks."""
        hashes = request.block_hashes
        bs = self.block_size
        parent = (
            hashes[-1]
            if hashes
            else root_hash(self.model_id, request.adapter_key, request.cache_salt)
        )
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hash_block(parent, request.token_slice(i * bs, (i + 1) * bs))
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Cached blocks of the request's longest cached prefix, and how many tokens they hold.

        At least one token is always left to compute (its logits are needed), and requests
        asking for prompt logprobs skip the cache (those need every prompt position's logits).
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_blocks = max_cached_blocks(request.num_tokens, self.block_size)
        hits: list[KVBlock] = []
        for block_hash in self.block_hashes(request)[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's prefix lookup."""
        self.queries += num_query_tokens
        self.hits += num_hit_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: list[KVBlock] | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens (after any cached `computed` blocks).

        Returns False, changing nothing, when the pool lacks free blocks.
        """
        computed = computed or []
        blocks = self._blocks.setdefault(request.request_id, [])
        total = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        needed = -(-total // self.block_size) - len(blocks) - len(computed)
        reusable = sum(1 for b in computed if b.ref_cnt == 0)
        if needed > self.pool.num_free_blocks - reusable:
            if not blocks:
                del self._blocks[request.request_id]
            return False
        if computed:
            self.pool.touch(computed)
            blocks.extend(computed)
            self._num_registered[request.request_id] = len(blocks)
        if needed > 0:
            blocks.extend(self.pool.allocate(needed))
        if computed or needed > 0:
            request.block_ids = [b.block_id for b in blocks]
        if self.enable_caching:  # only blocks of known tokens: never a speculative lookahead
            num_full = min(total, request.num_tokens) // self.block_size
            self._register_full_blocks(request, blocks, num_full)
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the request's blocks past those holding its first `num_tokens` tokens (the
        rejected part of a speculative lookahead; never a cached block)."""
        blocks = self._blocks.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if blocks is None or len(blocks) <= keep:
            return
        extra = blocks[keep:]
        del blocks[keep:]
        self.pool.free_unused(extra)
        request.block_ids = [b.block_id for b in blocks]

    def _register_full_blocks(self, request: Request, blocks: list[KVBlock], num_full: int) -> None:
        start = self._num_registered.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self.block_hashes(request)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], hashes[i])
        self._num_registered[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks at once (tail first, so its prefix stays cached longest)."""
        blocks = self._blocks.pop(request.request_id, [])
        self._num_registered.pop(request.request_id, None)
        self.pool.free(list(reversed(blocks)))
        request.block_ids = []

    def num_requests(self) -> int:
        """Requests currently holding blocks."""
        return len(self._blocks)
