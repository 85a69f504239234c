"""A small byte-level Llama trained for a fixed number of steps (a couple of minutes) on the Python standard library's
sources (text every machine has), cached on disk, with held-out files for measuring quality.

Files are split by a hash of their path: about one in ten is held out and never trained on.
Tokens are bytes + 3 (0 pad, 1 <s>, 2 </s>). Needs `transformers` (a test dependency).
"""

from __future__ import annotations

import json
import math
import sys
import sysconfig
import time
import zlib
from pathlib import Path
from typing import Any

import torch

VOCAB = 259
CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
"""Widths in whole int4 groups (128) so every choice quantizes every Linear."""


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) of the standard library's `.py` sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    held = [p for p in files if zlib.crc32(str(p.relative_to(root)).encode()) % 10 == 0]
    train = [p for p in files if zlib.crc32(str(p.relative_to(root)).encode()) % 10 != 0]
    return train, held


def encode(text: bytes) -> list[int]:
    """Byte tokens (+3)."""
    return [b + 3 for b in text]


def corpus(files: list[Path], limit: int | None = None) -> torch.Tensor:
    """The files' bytes as one token tensor (files separated by the token of byte 255)."""
    buf = bytearray()
    for p in files:
        try:
            buf += p.read_bytes() + bytes([255])  # byte 255: never in UTF-8 text, a separator
        except OSError:
            continue
        if limit is not None and len(buf) >= limit:
            break
    raw = torch.frombuffer(buf[:limit] if limit else buf, dtype=torch.uint8)
    return raw.long() + 3


def held_out_windows(count: int, length: int) -> list[list[int]]:
    """`count` token windows of `length` from distinct held-out files (the largest ones)."""
    _, held = stdlib_files()
    held = sorted(held, key=lambda p: p.stat().st_size, reverse=True)
    out = []
    for p in held:
        toks = encode(p.read_bytes())
        if len(toks) >= 2 * length:
            mid = len(toks) // 3
            out.append([1, *toks[mid : mid + length - 1]])
        if len(out) == count:
            break
    return out


def trained_model(cache_dir: Path, steps: int, log=print) -> Path:  # noqa: ANN001
    """The cached trained model's folder, training it first if needed. A step count, not a
    time budget, so a loaded machine trains the same model, only slower."""
    key = f"h{CONFIG['hidden_size']}-l{CONFIG['num_hidden_layers']}-n{steps}"
    key += f"-py{sys.version_info.major}{sys.version_info.minor}"
    path = cache_dir / f"stdlib-llama-{key}"
    if (path / "config.json").exists() and (path / "train.json").exists():
        log(f"using the cached model {path}")
        return path
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).float().train()
    train_files, _ = stdlib_files()
    data = corpus(train_files, limit=8_000_000)
    log(f"training on {len(data):,} stdlib bytes for {steps} steps")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.95))
    batch, seq = 8, 128
    g = torch.Generator().manual_seed(1)
    start, loss_ema = time.monotonic(), None
    for step in range(steps):
        lr = 2e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * math.cos(0.5 * math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[i : i + seq] for i in idx.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if (step + 1) % 50 == 0:
            elapsed = time.monotonic() - start
            log(f"  step {step + 1}/{steps} loss {loss_ema:.3f} ({elapsed:.0f} s)")
    path.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(path))
    (path / "train.json").write_text(json.dumps({"steps": steps, "loss": loss_ema}))
    log(f"trained {steps} steps, loss {loss_ema:.3f} nats/byte; cached at {path}")
    return path
