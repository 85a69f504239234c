"""Tiny (or bench-sized) random-weight HuggingFace models of the architectures the engine
serves, saved in the HuggingFace layout. The one builder for tests and benchmarks.

`hf_config(arch, **fields)` is a transformers config (the `TINY` sizes unless `tiny=False`);
`random_model(config, seed, init)` builds it with `init="hf"` (transformers' own init under
`torch.manual_seed(seed)`) or `init="unit"` (weights ~ N(0, 1/fan_in), norms ~ 1 + 0.2 N,
biases ~ 0.1 N: logits of order 1, so engine-vs-transformers comparisons are not vacuous).
Same arguments, same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
"""Sizes of the tiny test models (GQA: 4 query heads over 2 KV heads)."""

CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mixtral": "MixtralConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3_moe": "Qwen3MoeConfig",
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # a test dependency, not a serving one
        raise SystemExit(
            "building random models needs `transformers` (pip install 'loraplex[test]')"
        ) from exc
    return transformers


def hf_config(arch: str = "llama", *, tiny: bool = True, **fields: Any) -> Any:
    """A transformers config of `arch` (see CONFIG_CLASSES): `TINY` sizes unless `tiny=False`,
    then `fields`. Qwen3 models get head_dim 32 unless given."""
    if arch not in CONFIG_CLASSES:
        raise ValueError(f"unknown architecture {arch!r}; one of {sorted(CONFIG_CLASSES)}")
    values = {**(TINY if tiny else {}), **fields}
    if arch.startswith("qwen3") and tiny:
        values.setdefault("head_dim", 32)
    return getattr(_transformers(), CONFIG_CLASSES[arch])(**values)


def random_model(config: Any, seed: int = 0, init: str = "unit") -> Any:
    """A random-weight transformers causal LM of `config`, fp32, in eval mode (see module doc).
    Typed Any: transformers is a test extra, and its own types lose the model through `.to`."""
    transformers = _transformers()
    torch.manual_seed(seed)
    if init == "hf":
        cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
        return cls(config).float().eval()
    if init != "unit":
        raise ValueError(f"init is 'hf' or 'unit', got {init!r}")
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


def save_char_tokenizer(path: str | Path, vocab_size: int = 128) -> None:
    """A character-level tokenizer (lowercase, digits, punctuation, space) with <s> = 1,
    </s> = 2 and a simple chat template, written to `path`."""
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


def save_random_model(
    path: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    init: str = "unit",
    tiny: bool = True,
    with_tokenizer: bool = False,
    max_shard_size: str | None = None,
    **fields: Any,
) -> torch.nn.Module:
    """Build `random_model(hf_config(arch, tiny=tiny, **fields), seed, init)`, save it (and,
    if asked, the character tokenizer) to `path`; returns the transformers model."""
    config = hf_config(arch, tiny=tiny, **fields)
    model = random_model(config, seed, init)
    extra = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **extra)
    if with_tokenizer:
        save_char_tokenizer(path, config.vocab_size)
    return model


def save_tiny_model(
    path: str | Path,
    arch: str = "llama",
    *,
    tie: bool = False,
    seed: int = 0,
    with_tokenizer: bool = True,
    max_shard_size: str | None = None,
    **fields: Any,
) -> torch.nn.Module:
    """The engine tests' tiny model: `TINY` sizes, unit init, <s> = 1 and </s> = 2, with the
    character tokenizer unless `with_tokenizer=False`; returns the transformers model."""
    return save_random_model(
        path, arch, seed=seed, init="unit", with_tokenizer=with_tokenizer,
        max_shard_size=max_shard_size, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        **fields,
    )  # fmt: skip
