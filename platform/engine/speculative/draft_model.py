"""The draft model of `method="draft_model"`: a small model sharing the target's tokenizer,
run by the speculator with its own paged KV cache.

Per drafting request the draft cache holds a prefix of the request's tokens; each step it
catches up on what the target accepted (truncating drafts the target rejected), then runs K
single-token steps, sampling each draft from q, the draft's distribution after the request's own
sampling settings (`Sampler.distribution`), which verification needs for the rejection rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from loraplex.loader.storage import StorageConfig
from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.kv_cache import allocate_kv_cache, kv_cache_bytes_per_block
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampler import Sampler
from loraplex.platform.engine.speculative.draft_adapters import DraftAdapters
from loraplex.platform.engine.speculative.verify import DraftTokens, draft_view

DRAFT_KV_BYTES = 256 << 20  # the draft's KV cache when the engine gives no budget


@dataclass
class _Seq:
    tokens: list[int] = field(default_factory=list)  # in the draft cache, in order
    blocks: list[int] = field(default_factory=list)


class DraftModel:
    """A draft model, its paged KV cache and the per-request state of that cache."""

    def __init__(
        self,
        model: nn.Module,
        vocab_size: int,
        block_size: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        kv_bytes: int = DRAFT_KV_BYTES,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        fn = getattr(model, "compute_logits", None)  # hidden -> logits, as the runner's
        if not callable(fn):
            raise TypeError(f"{type(model).__name__} has no compute_logits(hidden) method")
        self.compute_logits = fn
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.device = torch.device(device)
        num_blocks = max(
            self.max_blocks, kv_bytes // kv_cache_bytes_per_block(model, block_size, dtype)
        )
        self.num_blocks = int(num_blocks)
        self.kv_caches = allocate_kv_cache(model, self.num_blocks, block_size, dtype, self.device)
        self.free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self.seqs: dict[str, _Seq] = {}
        self.adapters: DraftAdapters | None = None  # draft adapters, for method draft_adapter
        self.storage: StorageConfig | None = None  # where draft adapters are fetched from
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @classmethod
    def load(
        cls,
        path: str,
        target_vocab_size: int,
        *,
        block_size: int,
        max_model_len: int,
        dtype: str,
        device: str,
        seed: int = 0,
        storage: StorageConfig | None = None,
    ) -> DraftModel:
        """Load the draft model at `path` (a folder, or s3:// read with `storage`) with the
        engine's loader; refuses a vocabulary other than the target's (the draft must share
        the tokenizer)."""
        from loraplex.platform.engine.model_source import load_engine_model
        from loraplex.platform.engine_spec.config import EngineConfig

        config = EngineConfig(model=path, dtype=dtype, device=device, max_loras=0, storage=storage)
        loaded = load_engine_model(config, Timeline(f"draft {path}"))
        vocab = int(loaded.hf_config["vocab_size"])
        if vocab != target_vocab_size:
            raise ValueError(
                f"the draft model {path!r} has a vocabulary of {vocab} tokens, the target "
                f"{target_vocab_size}: a draft model must share the target's tokenizer"
            )
        limit = int(loaded.hf_config.get("max_position_embeddings", max_model_len))
        drafter = cls(loaded.model, vocab, block_size, min(max_model_len, limit), loaded.dtype,
                      device, seed=seed)  # fmt: skip
        drafter.storage = storage
        return drafter

    def enable_adapters(self, max_loras: int, max_lora_rank: int) -> None:
        """Serve draft adapters on this model (method draft_adapter), fetched from the object
        store the draft model was read with (the engine's storage settings), if any."""
        store = None
        if self.storage is not None:
            from loraplex.loader.object_store import ObjectStore

            store = ObjectStore(self.storage)
        self.adapters = DraftAdapters(self.model, max_loras, max_lora_rank, store)

    @property
    def num_free_blocks(self) -> int:
        """Draft cache blocks not held by any request."""
        return len(self.free)

    def release(self, request_id: str) -> None:
        """Give a finished request's draft cache blocks back."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.free += seq.blocks

    def propose(
        self, requests: list[Request], ks: list[int], sampler: Sampler
    ) -> list[DraftTokens | None]:
        """Per request, `ks[i]` drafts sampled from the draft model with their distributions
        (None where its draft cache has no room: it drafts otherwise this step)."""
        live: list[int] = []
        starts: list[int] = []
        news: list[list[int]] = []
        keys = [self.draft_key(r) for r in requests]
        order = sorted(range(len(requests)), key=lambda i: (keys[i] is None, keys[i] or ""))
        for i in order:  # rows of one draft adapter side by side (the LoRA metadata's groups)
            r, k = requests[i], ks[i]
            got = self._catch_up(r, k)
            if got is not None:
                live.append(i)
                starts.append(got[0])
                news.append(got[1])
        out: list[DraftTokens | None] = [None] * len(requests)
        if not live:
            return out
        logits = self._forward([requests[i] for i in live], [keys[i] for i in live], starts, news)
        drafts: dict[int, list[int]] = {i: [] for i in live}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in live}
        active = list(range(len(live)))  # rows of `logits` still drafting
        depth = 0
        while active:
            idx = [live[a] for a in active]
            views = [draft_view(requests[i], drafts[i]) for i in idx]
            q = sampler.distribution(logits[active] if len(active) < len(logits) else logits, views)
            tok = torch.multinomial(q, 1, generator=self.generator).squeeze(1).tolist()
            for j, i in enumerate(idx):
                drafts[i].append(tok[j])
                probs[i].append(q[j])
            depth += 1
            active = [a for a in active if ks[live[a]] > depth]
            if not active:
                break
            ids = [live[a] for a in active]
            pos = [len(self.seqs[requests[i].request_id].tokens) for i in ids]
            logits = self._forward(
                [requests[i] for i in ids],
                [keys[i] for i in ids],
                pos,
                [[drafts[i][-1]] for i in ids],
            )
            active = list(range(len(ids)))
            live = ids
        for i, d in drafts.items():
            out[i] = DraftTokens(d, torch.stack(probs[i]))
        return out

    def draft_key(self, request: Request) -> str | None:
        """The draft adapter drafting for this request's adapter (None: the plain draft)."""
        return None if self.adapters is None else self.adapters.key_for(request.adapter_key)

    def _catch_up(self, r: Request, k: int) -> tuple[int, list[int]] | None:
        """Truncate the request's draft cache to what it shares with the request's tokens
        and reserve blocks for the rest and `k` drafts: (first new position, new tokens)."""
        seq = self.seqs.setdefault(r.request_id, _Seq())
        tokens = r.token_slice(0, r.num_tokens)
        held = seq.tokens
        if held != tokens[: len(held)]:
            same = 0
            for a, b in zip(held, tokens, strict=False):
                if a != b:
                    break
                same += 1
            del held[same:]
        del held[len(tokens) - 1 :]  # at least the last token runs, for its logits
        need = -(-(len(tokens) + k - 1) // self.block_size)
        if need > self.max_blocks or need - len(seq.blocks) > len(self.free):
            return None
        while len(seq.blocks) < need:
            seq.blocks.append(self.free.pop())
        return len(held), tokens[len(held) :]

    def _forward(
        self,
        requests: list[Request],
        keys: list[str | None],
        starts: list[int],
        news: list[list[int]],
    ) -> torch.Tensor:
        """Run each request's new tokens at their positions (with its draft adapter `keys[i]`);
        the logits of each one's last token [N, V]."""
        rids = [r.request_id for r in requests]
        lora = None
        if self.adapters is not None and any(k is not None for k in keys):
            lora = self.adapters.meta(requests, keys, [len(n) for n in news])
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        qsl, seq_lens, last = [0], [], []
        tables = torch.zeros(len(rids), self.max_blocks, dtype=torch.int32)
        for i, (rid, start, new) in enumerate(zip(rids, starts, news, strict=True)):
            seq = self.seqs[rid]
            end = start + len(new)
            ids += new
            pos += range(start, end)
            slots += [seq.blocks[p // bs] * bs + p % bs for p in range(start, end)]
            tables[i, : len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
            qsl.append(qsl[-1] + len(new))
            seq_lens.append(end)
            last.append(qsl[-1] - 1)
            seq.tokens += new
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(dev),
            context_lens=torch.tensor(starts, dtype=torch.int32).to(dev),
            block_tables=tables.to(dev),
            max_query_len=max(len(n) for n in news),
            max_seq_len=max(seq_lens),
            is_decode_only=all(len(n) == 1 for n in news),
        )
        with torch.inference_mode(), forward_context(ForwardContext(attn=md, lora=lora)):
            hidden = self.model(
                torch.tensor(ids, dtype=torch.int64).to(dev),
                torch.tensor(pos, dtype=torch.int64).to(dev),
            )
            return self.compute_logits(hidden[torch.tensor(last, device=dev)]).float()
