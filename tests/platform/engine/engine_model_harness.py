"""Test helpers: tiny random-weight HF models saved to disk, and a paged-KV harness that builds
AttentionMetadata for hand-written (sequence, new tokens) chunks without the scheduler.

Imported by the engine model tests (and usable by other engine tests); not a conftest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.platform.engine.forward_context import ForwardContext, forward_context  # noqa: E402
from loraplex.platform.engine.kv_cache import allocate_kv_cache  # noqa: E402
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata  # noqa: E402

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)


def make_hf_config(arch: str, *, tie: bool = False, rope_scaling: dict | None = None, **kw: Any):
    """A tiny transformers config of `arch` ("llama", "qwen2", "qwen3") with GQA."""
    import transformers

    opts = {**TINY, **kw, "tie_word_embeddings": tie}
    if arch == "llama":
        if rope_scaling is not None:
            opts["rope_scaling"] = rope_scaling
        return transformers.LlamaConfig(**opts)
    if arch == "qwen2":
        return transformers.Qwen2Config(**opts)
    if arch == "qwen3":
        opts.setdefault("head_dim", 32)
        return transformers.Qwen3Config(**opts)
    raise ValueError(arch)


def make_hf_model(config: Any, seed: int = 0) -> torch.nn.Module:
    """A random-weight transformers causal LM with weights big enough for logits of order 1."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[-1] ** 0.5))
    return model.eval()


def save_tiny_tokenizer(path: str | Path, vocab_size: int = 128) -> None:
    """A character-level tokenizer (lowercase, digits, punctuation, space) with <s>, </s>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 .,!?'\n") + list(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    )
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in chars:
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<s>", "</s>"])
    path = Path(path)
    tok.save(str(path / "tokenizer.json"))
    template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template})
    )


def save_tiny_model(
    path: str | Path,
    arch: str = "llama",
    *,
    tie: bool = False,
    rope_scaling: dict | None = None,
    seed: int = 0,
    max_shard_size: str | None = None,
    with_tokenizer: bool = True,
    **kw: Any,
) -> torch.nn.Module:
    """Save a tiny random model (and tokenizer) to `path`; returns the transformers model."""
    config = make_hf_config(arch, tie=tie, rope_scaling=rope_scaling, **kw)
    config.bos_token_id, config.eos_token_id = 1, 2
    model = make_hf_model(config, seed)
    extra = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **extra)
    if with_tokenizer:
        save_tiny_tokenizer(path, config.vocab_size)
    return model


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
        logits = self.model.compute_logits(hidden)
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
