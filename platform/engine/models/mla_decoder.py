"""The DeepSeek-V2/V3 decoder skeleton: MLA attention blocks, dense-then-MoE layers.

Parameter names mirror transformers' (`q_a_proj`, `q_a_layernorm`, `q_b_proj` or `q_proj`,
`kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), so the checkpoint loads as is.
The KV cache holds each token's latent row (`layers.mla_attention`); `kv_b_proj` is never run
on the cache: its two halves are absorbed into the query (W_UK) and the output (W_UV).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.layers.mla_attention import MLAAttention
from loraplex.platform.engine.layers.mla_rope import MLARotary, mla_softmax_scale
from loraplex.platform.engine.layers.norm import RMSNorm
from loraplex.platform.engine.layers.onednn_weights import dense
from loraplex.platform.engine.layers.quant import current_linear_scheme
from loraplex.platform.engine.models.causal_lm import CausalLM
from loraplex.platform.engine.models.decoder import DecoderConfig, DenseMLP, LMHead
from loraplex.platform.engine.models.weight_loading import load_hf_weights

LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with their default


@dataclass(frozen=True)
class MLAConfig:
    """MLA shapes read from a DeepSeek config.json."""

    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    interleaved_rope: bool

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: the no-rope part plus the rotary part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_hf(cls, raw: dict[str, Any], interleaved_rope: bool) -> MLAConfig:
        """Read the MLA fields (q_lora_rank may be null: a plain q_proj, as DeepSeek-V2-Lite)."""
        q_rank = raw.get("q_lora_rank")
        return cls(
            num_heads=int(raw["num_attention_heads"]),
            q_lora_rank=int(q_rank) if q_rank else None,
            kv_lora_rank=int(raw["kv_lora_rank"]),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
            v_head_dim=int(raw["v_head_dim"]),
            attention_bias=bool(raw.get("attention_bias", False)),
            interleaved_rope=interleaved_rope,
        )


class MLASelfAttention(nn.Module):
    """Low-rank queries, the compressed KV latent with a decoupled rotary key, paged latent
    attention with the up-projection absorbed, then o_proj."""

    def __init__(
        self, config: DecoderConfig, mla: MLAConfig, layer_idx: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        scheme = current_linear_scheme()
        if scheme is not None:
            raise NotImplementedError(
                f"quantized weights ({scheme.name}) are not served with multi-head latent "
                "attention (MLA: DeepSeek-V2/V3) yet: its projections are built unquantized and "
                "kv_b_proj is read whole to absorb the up-projection; load the float weights"
            )
        self.mla = mla
        h, hid, bias = mla.num_heads, config.hidden_size, mla.attention_bias

        def linear(i: int, o: int, name: str, b: bool = False) -> Linear:
            return Linear(i, o, bias=b, layer_idx=layer_idx, name=name, dtype=dtype)

        if mla.q_lora_rank is None:
            self.q_proj: Linear | None = linear(hid, h * mla.qk_head_dim, "q_proj")
        else:
            self.q_proj = None
            self.q_a_proj = linear(hid, mla.q_lora_rank, "q_a_proj", bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS, dtype)
            self.q_b_proj = linear(mla.q_lora_rank, h * mla.qk_head_dim, "q_b_proj")
        c, r = mla.kv_lora_rank, mla.qk_rope_head_dim
        self.kv_a_proj_with_mqa = linear(hid, c + r, "kv_a_proj_with_mqa", bias)
        self.kv_a_layernorm = RMSNorm(c, LATENT_NORM_EPS, dtype)
        self.kv_b_proj = linear(c, h * (mla.qk_nope_head_dim + mla.v_head_dim), "kv_b_proj")
        self.o_proj = linear(h * mla.v_head_dim, hid, "o_proj", bias)
        scale = mla_softmax_scale(mla.qk_head_dim, config.rope)
        self.attn = MLAAttention(h, c, r, scale, layer_idx)
        self._absorbed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def load_hf_weight(self, name: str, tensor: torch.Tensor) -> list[str]:
        """Loader hook: every tensor by its own name (a plain `q_proj` is not a q/k/v slice)."""
        param = dict(self.named_parameters()).get(name)
        if param is None:
            raise ValueError(f"checkpoint tensor self_attn.{name} has no place in MLA attention")
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"self_attn.{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(tensor)
        return [name]

    def absorbed(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, dn, C] and W_UV [H, dv, C] from kv_b_proj's weight (kept while it stays)."""
        if self.kv_b_proj.lora_delta is not None:
            raise NotImplementedError("LoRA on kv_b_proj is not served for MLA models yet")
        w = self.kv_b_proj.weight
        if self._absorbed is None or self._absorbed[0] is not w:  # loading replaces it
            m = self.mla
            full = dense(w.data).view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, -1)
            uk, uv = full.split([m.qk_nope_head_dim, m.v_head_dim], dim=1)
            self._absorbed = (w, uk.contiguous(), uv.contiguous())
        return self._absorbed[1].to(dtype), self._absorbed[2].to(dtype)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: MLARotary
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        m, t = self.mla, x.shape[0]
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(t, m.num_heads, m.qk_head_dim)
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        kv = self.kv_a_proj_with_mqa(x)
        latent, k_pe = kv.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_pe = rope.rotate(q_pe, cos, sin)
        k_pe = rope.rotate(k_pe[:, None, :], cos, sin)[:, 0]
        w_uk, w_uv = self.absorbed(x.dtype)
        q_lat = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        out_lat = self.attn.forward_latent(q_lat, q_pe, latent, k_pe)
        out = torch.einsum("thc,hvc->thv", out_lat, w_uv)
        projected: torch.Tensor = self.o_proj(out.reshape(t, m.num_heads * m.v_head_dim))
        return projected


class MLADecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); `mlp` dense or MoE."""

    def __init__(
        self,
        config: DecoderConfig,
        mla: MLAConfig,
        layer_idx: int,
        mlp: nn.Module,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = MLASelfAttention(config, mla, layer_idx, dtype)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: MLARotary
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, rope)
        mlp_out: torch.Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class MLADecoderModel(nn.Module):
    """Embedding, the layers, the final norm and the decoupled rope (HF's `model.`)."""

    def __init__(
        self,
        config: DecoderConfig,
        mla: MLAConfig,
        layers: list[MLADecoderLayer],
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, dtype=dtype),
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = MLARotary(
            mla.qk_rope_head_dim, config.rope, config.max_position_embeddings, mla.interleaved_rope
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, self.rotary_emb)
        out: torch.Tensor = self.norm(h)
        return out


class MLAForCausalLM(CausalLM):
    """Causal LM over MLA layers, each with the dense MLP unless `make_mlp` (the MoE mixin)
    says otherwise."""

    def __init__(self, config: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        self.hf_config = dict(config)
        self.dtype = dtype
        c = self.config = self.configure(DecoderConfig.from_hf(config))
        self.mla = MLAConfig.from_hf(config, self.interleaved_rope(config))
        layers = [
            MLADecoderLayer(c, self.mla, i, self.make_mlp(c, i, dtype), dtype)
            for i in range(c.num_hidden_layers)
        ]
        self.model = MLADecoderModel(c, self.mla, layers, dtype)
        self.lm_head = LMHead(c.vocab_size, c.hidden_size, dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def interleaved_rope(self, config: dict[str, Any]) -> bool:
        """Whether the rotary dims pair up interleaved (DeepSeek-V2 always; V3 by config)."""
        return True

    def configure(self, config: DecoderConfig) -> DecoderConfig:
        """Set the dense MLP's bias (DeepSeek-V2 reads `mlp_bias`; V3 has none)."""
        config.mlp_bias = bool(config.raw.get("mlp_bias", False))
        return config

    def make_mlp(self, config: DecoderConfig, layer_idx: int, dtype: torch.dtype) -> nn.Module:
        """The dense SwiGLU MLP (the MoE mixin returns sparse blocks past the dense layers)."""
        return DenseMLP(config, layer_idx, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids [T], positions [T] -> hidden [T, hidden] (forward context set)."""
        out: torch.Tensor = self.model(input_ids, positions)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, V] in the model's dtype."""
        out: torch.Tensor = self.lm_head(hidden)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the checkpoint, skipping DeepSeek-V3's multi-token-prediction layers (stored
        as layers past `num_hidden_layers`; this engine does not run them)."""
        tied = self.config.tie_word_embeddings
        n = self.config.num_hidden_layers
        load_hf_weights(self, _decoder_weights(weights, n), skip_lm_head=tied)
        self.lm_head.finish_loading(tied)


def _decoder_weights(
    weights: Iterable[tuple[str, torch.Tensor]], num_layers: int
) -> Iterable[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors of the first `num_layers` layers and the rest of the model."""
    for name, tensor in weights:
        parts = name.split(".")
        if len(parts) > 2 and parts[:2] == ["model", "layers"] and int(parts[2]) >= num_layers:
            continue
        yield name, tensor
