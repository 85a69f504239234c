"""A paged-KV harness for the engine model tests: builds AttentionMetadata for hand-written
(sequence, new tokens) chunks without the scheduler, and checks logits against transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.kv_cache import allocate_kv_cache
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata


@dataclass
class PagedHarness:
    """Owns a small KV cache and per-sequence block tables; runs the model on chunks."""

    model: torch.nn.Module
    num_blocks: int = 64
    block_size: int = 4
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    tables: dict[str, list[int]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        allocate_kv_cache(self.model, self.num_blocks, self.block_size, self.dtype, self.device)
        # hand out blocks in a scrambled order so block ids never equal logical indices
        self.free = list(range(self.num_blocks - 1, 0, -1))
        self.free = self.free[::2] + self.free[1::2]

    def fork_prefix(self, src: str, dst: str, num_blocks: int) -> None:
        """Start `dst` with `src`'s first full blocks already cached (a prefix-cache hit)."""
        self.tables[dst] = list(self.tables[src][:num_blocks])
        self.tokens[dst] = list(self.tokens[src][: num_blocks * self.block_size])

    def build(
        self, chunks: list[tuple[str, list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """input_ids, positions and metadata for chunks; allocates blocks, appends tokens."""
        ids, pos, slots, qsl, seq_lens, ctx_lens = [], [], [], [0], [], []
        for seq, new in chunks:
            table = self.tables.setdefault(seq, [])
            hist = self.tokens.setdefault(seq, [])
            start = len(hist)
            end = start + len(new)
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            for p in range(start, end):
                slots.append(table[p // self.block_size] * self.block_size + p % self.block_size)
            ids += new
            pos += list(range(start, end))
            hist += new
            qsl.append(qsl[-1] + len(new))
            seq_lens.append(end)
            ctx_lens.append(start)
        width = max(len(self.tables[s]) for s, _ in chunks)
        bt = torch.zeros(len(chunks), width, dtype=torch.int32)
        for i, (seq, _) in enumerate(chunks):
            bt[i, : len(self.tables[seq])] = torch.tensor(self.tables[seq], dtype=torch.int32)
        dev = self.device
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=dev),
            block_tables=bt.to(dev),
            max_query_len=max(len(n) for _, n in chunks),
            max_seq_len=max(seq_lens),
            is_decode_only=all(len(n) == 1 for _, n in chunks),
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(pos, dtype=torch.int64, device=dev),
            md,
        )

    @torch.no_grad()
    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run one forward; returns fp32 logits [len(new), V] for every chunk."""
        input_ids, positions, md = self.build(chunks)
        with forward_context(ForwardContext(attn=md)):
            hidden = self.model(input_ids, positions)
        logits = self.model.compute_logits(hidden).float()
        starts = md.query_start_loc.tolist()
        return [logits[starts[i] : starts[i + 1]] for i in range(len(chunks))]


@torch.no_grad()
def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """Reference fp32 logits [len(tokens), V] from transformers on the whole sequence."""
    out = hf_model(torch.tensor([tokens], dtype=torch.int64))
    return out.logits[0].float()


def check_against_hf(
    harness: PagedHarness, hf_model: torch.nn.Module, seq: str, logits: torch.Tensor, atol: float
) -> None:
    """Assert the chunk's logits equal transformers' at the same positions of `seq`."""
    tokens = harness.tokens[seq]
    ref = hf_logits(hf_model, tokens)[len(tokens) - logits.shape[0] :]
    assert ref.abs().max() > 0.5, "reference logits too small for a meaningful comparison"
    torch.testing.assert_close(logits, ref, atol=atol, rtol=0)


def run_mixed_scenario(
    model: torch.nn.Module, hf_model: torch.nn.Module, atol: float = 1e-4
) -> None:
    """Prefill, a prompt split over two steps, decodes and a prefix-cache hit in shared batches,
    then decode-only steps; every token's logits are checked against transformers."""
    h = PagedHarness(model, block_size=4)
    g = torch.Generator().manual_seed(1)
    v = hf_model.config.vocab_size
    p0 = torch.randint(0, v, (13,), generator=g).tolist()
    p1 = torch.randint(0, v, (9,), generator=g).tolist()
    p2 = p1[:8] + torch.randint(0, v, (5,), generator=g).tolist()
    seqs = ("s0", "s1", "s2")

    out = h.step([("s0", p0[:7]), ("s1", p1)])
    check_against_hf(h, hf_model, "s0", out[0], atol)
    check_against_hf(h, hf_model, "s1", out[1], atol)
    # rest of p0 over its cached context, a decode for s1, and s2 starting from a
    # prefix-cache hit on s1's first two blocks
    h.fork_prefix("s1", "s2", 2)
    nxt = int(out[1][-1].argmax())
    out = h.step([("s0", p0[7:]), ("s1", [nxt]), ("s2", p2[8:])])
    for seq, lg in zip(seqs, out, strict=True):
        check_against_hf(h, hf_model, seq, lg, atol)
    for _ in range(3):
        out = h.step([(s, [int(lg[-1].argmax())]) for s, lg in zip(seqs, out, strict=True)])
        for seq, lg in zip(seqs, out, strict=True):
            check_against_hf(h, hf_model, seq, lg, atol)
