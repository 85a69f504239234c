"""The generic Llama-family decoder: attention block, dense MLP, decoder layer, causal LM skeleton.

Architectures differ only in a few switches (q/k/v bias, per-head q/k norm, the MLP), so each
model class is a thin subclass of `DecoderForCausalLM`. Parameter names mirror HuggingFace's,
with q/k/v fused into `qkv_proj` and gate/up into `gate_up_proj`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.platform.engine.layers.activation import check_activation, silu_and_mul
from loraplex.platform.engine.layers.attention import Attention
from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_silu_mul
from loraplex.platform.engine.layers.linear import Linear, MergedLinear
from loraplex.platform.engine.layers.norm import RMSNorm
from loraplex.platform.engine.layers.onednn_weights import (
    can_pack,
    is_packed,
    pack_weight,
    packed_linear,
)
from loraplex.platform.engine.layers.rotary import RotaryEmbedding, apply_rotary
from loraplex.platform.engine.models.causal_lm import CausalLM
from loraplex.platform.engine.models.decoder_config import DecoderConfig
from loraplex.platform.engine.models.weight_loading import load_hf_weights

__all__ = ["DecoderConfig", "DecoderForCausalLM", "DecoderLayer", "DenseMLP", "SelfAttention"]


class DenseMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)) with gate/up fused."""

    def __init__(self, config: DecoderConfig, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        check_activation(config.hidden_act)
        inter = config.intermediate_size
        self.gate_up_proj = MergedLinear(
            config.hidden_size,
            [inter, inter],
            ["gate_proj", "up_proj"],
            bias=config.mlp_bias,
            layer_idx=layer_idx,
            dtype=dtype,
        )
        self.down_proj = Linear(
            inter,
            config.hidden_size,
            bias=config.mlp_bias,
            layer_idx=layer_idx,
            name="down_proj",
            dtype=dtype,
        )
        # The deterministic mode's SiLU-and-mul, whose result for a row never depends on the
        # rows beside it (`batch_invariant.py` sets it).
        self.fixed_order = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        gate_up = self.gate_up_proj(x)
        act = fixed_order_silu_mul(gate_up) if self.fixed_order else silu_and_mul(gate_up)
        out: torch.Tensor = self.down_proj(act)
        return out


class SelfAttention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k RMSNorm, rope, paged attention, o_proj."""

    def __init__(self, config: DecoderConfig, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        d = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            [self.q_size, self.kv_size, self.kv_size],
            ["q_proj", "k_proj", "v_proj"],
            bias=config.qkv_bias,
            layer_idx=layer_idx,
            dtype=dtype,
        )
        self.o_proj = Linear(
            self.q_size,
            config.hidden_size,
            bias=config.o_bias,
            layer_idx=layer_idx,
            name="o_proj",
            dtype=dtype,
        )
        if config.qk_norm:
            self.q_norm: RMSNorm | None = RMSNorm(d, config.rms_norm_eps, dtype)
            self.k_norm: RMSNorm | None = RMSNorm(d, config.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        self.attn = Attention(self.num_heads, self.num_kv_heads, d, d**-0.5, layer_idx)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = self.attn(q.reshape(t, -1), k.reshape(t, -1), v)
        projected: torch.Tensor = self.o_proj(out)
        return projected


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); `mlp` is dense or MoE."""

    def __init__(
        self, config: DecoderConfig, layer_idx: int, mlp: nn.Module, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = SelfAttention(config, layer_idx, dtype)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class DecoderModel(nn.Module):
    """Embedding, the decoder layers and the final norm (HF's `model.` submodule)."""

    def __init__(self, config: DecoderConfig, layers: list[DecoderLayer], dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, dtype=dtype),
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, H]."""
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        out: torch.Tensor = self.norm(h)
        return out


class LMHead(nn.Module):
    """Output projection to the vocabulary (its weight may be the tied embedding)."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        # a Parameter, or the tied embedding's (which torch types as a Tensor)
        self.weight: torch.Tensor = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype))

    def finish_loading(self, tied: bool) -> None:
        """Pack an untied bf16 CPU weight for oneDNN (a tied one stays plain: the embedding
        looks rows up in it, and a packed copy would cost vocab x hidden more memory)."""
        if not tied and can_pack(self.weight):
            self.weight = nn.Parameter(pack_weight(self.weight.data), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] in the weight's dtype."""
        w = self.weight
        return packed_linear(hidden, w) if is_packed(w) else F.linear(hidden, w)


class DecoderForCausalLM(CausalLM):
    """Causal LM skeleton shared by the Llama-family architectures.

    Subclasses override `configure` (biases, q/k norm, unsupported options) and, for MoE,
    `make_mlp`. Reads attention metadata from the forward context.
    """

    def __init__(self, config: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        self.hf_config = dict(config)
        self.dtype = dtype
        self.config = self.configure(DecoderConfig.from_hf(config))
        c = self.config
        layers = [
            DecoderLayer(c, i, self.make_mlp(c, i, dtype), dtype)
            for i in range(c.num_hidden_layers)
        ]
        self.model = DecoderModel(c, layers, dtype)
        self.lm_head = LMHead(c.vocab_size, c.hidden_size, dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        """Set architecture switches on the parsed config (override per architecture)."""
        return config

    def make_mlp(self, config: DecoderConfig, layer_idx: int, dtype: torch.dtype) -> nn.Module:
        """The feed-forward block of a layer; dense by default, MoE models override."""
        return DenseMLP(config, layer_idx, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids [T] int64, positions [T] int64 -> hidden [T, H] (forward context set)."""
        out: torch.Tensor = self.model(input_ids, positions)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] in the model's dtype (the sampler upcasts to fp32
        where it computes more than an argmax)."""
        out: torch.Tensor = self.lm_head(hidden)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a HuggingFace checkpoint's (name, tensor) pairs, fusing q/k/v and gate/up."""
        tied = self.config.tie_word_embeddings
        load_hf_weights(self, weights, skip_lm_head=tied)
        self.lm_head.finish_loading(tied)
