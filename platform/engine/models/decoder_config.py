"""The subset of a HuggingFace config the decoder skeleton needs, parsed once with defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.engine.layers.rotary import rope_parameters_from_config


@dataclass
class DecoderConfig:
    """Shapes and options of a Llama-family decoder; `raw` keeps the whole HF config (MoE fields)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    rope: dict[str, Any]
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> DecoderConfig:
        """Read the common fields; architecture classes then set biases and norms."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                hidden_act=str(config.get("hidden_act", "silu")),
                rope=rope_parameters_from_config(config),
                raw=dict(config),
            )
        except KeyError as exc:
            raise ValueError(f"config.json lacks the required field {exc.args[0]!r}") from None
