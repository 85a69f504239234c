"""A byte-level BPE tokenizer with a 128k vocabulary made offline (no weights or tokenizer
download): the 256 byte tokens plus word-like, number and JSON-punctuation tokens, so grammar
mask times are measured at the vocabulary size of today's large models."""

from __future__ import annotations

import random

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
WEIGHTS = [12, 9, 8, 7.5, 7, 6.7, 6.3, 6, 5.9, 4.3, 4, 2.8, 2.8, 2.4, 2.4, 2.2, 2, 2, 1.9, 1.5,
           1, 0.8, 0.2, 0.2, 0.1, 0.1]  # fmt: skip
PUNCT = ["{", "}", '"', ":", ",", "[", "]", '":', '",', '":"', '{"', '"}', "},", ".", "-", "_",
         "\n", "  ", "    "]  # fmt: skip


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are made of)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = dict(zip(keep, keep, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {b: chr(c) for b, c in chars.items()}


def vocab_tokens(size: int = 128_000, seed: int = 0) -> list[str]:
    """`size` distinct byte-level token strings (deterministic for a seed)."""
    rng = random.Random(seed)
    to_char = _byte_chars()
    tokens = [to_char[b] for b in range(256)]
    seen = set(tokens)
    while len(tokens) < size:
        r = rng.random()
        if r < 0.7:
            word = "".join(rng.choices(LETTERS, WEIGHTS, k=rng.randint(2, 9)))
            word = (" " + word) if rng.random() < 0.5 else word
        elif r < 0.85:
            word = "".join(rng.choices("0123456789", k=rng.randint(1, 3)))
        else:
            word = "".join(rng.choices(PUNCT, k=rng.randint(1, 3)))
        token = "".join(to_char[b] for b in word.encode())
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    return tokens


def tokenizer_json(size: int = 128_000) -> tuple[str, int]:
    """(tokenizer.json text, EOS id) of a byte-level BPE over `vocab_tokens(size)` + `</s>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(vocab_tokens(size))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["</s>"])
    eos = tok.token_to_id("</s>")
    assert eos is not None  # added just above
    return tok.to_str(), eos
