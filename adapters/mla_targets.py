"""LoRA targets of a multi-head latent attention (DeepSeek-V2/V3) base: names and shapes.

MLA's projections are `q_proj` (or the low-rank pair `q_a_proj` -> `q_b_proj`),
`kv_a_proj_with_mqa` (to the KV latent and the shared rotary key), `kv_b_proj` (latent to
per-head keys and values) and `o_proj`. The engine serves LoRA on all of them but `kv_b_proj`,
whose weight it absorbs into the latent attention instead of running it (torch-free).
"""

from __future__ import annotations

from typing import Any

MLA_MODULES = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")
"""MLA projections beyond the ones dense attention shares (q_proj, o_proj)."""

UNSERVED_MLA_MODULES = {
    "kv_b_proj": "its weight is absorbed into the latent attention, never run as a projection"
}


def is_mla_config(hf_config: dict[str, Any]) -> bool:
    """True for a base with multi-head latent attention (its config names `kv_lora_rank`)."""
    return hf_config.get("kv_lora_rank") is not None


def mla_module_dims(hf_config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-targetable MLA projection."""
    hidden = int(hf_config["hidden_size"])
    heads = int(hf_config["num_attention_heads"])
    qk_head = int(hf_config["qk_nope_head_dim"]) + int(hf_config["qk_rope_head_dim"])
    latent = int(hf_config["kv_lora_rank"]) + int(hf_config["qk_rope_head_dim"])
    dims = {
        "kv_a_proj_with_mqa": (hidden, latent),
        "o_proj": (heads * int(hf_config["v_head_dim"]), hidden),
    }
    q_rank = hf_config.get("q_lora_rank")
    if q_rank:
        dims |= {"q_a_proj": (hidden, int(q_rank)), "q_b_proj": (int(q_rank), heads * qk_head)}
    else:
        dims["q_proj"] = (hidden, heads * qk_head)
    return dims
