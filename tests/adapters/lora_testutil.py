"""Test helpers shared by the multi-LoRA tests: a tiny random Llama and PEFT adapters over it.

Everything is built in code and saved to tmp dirs; nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

TINY_LLAMA = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def tiny_llama(seed: int = 0, **overrides):
    """A tiny random-weight transformers LlamaForCausalLM in fp32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**(TINY_LLAMA | overrides))
    model = LlamaForCausalLM(cfg).float().eval()
    return model


def save_base(model, path: Path) -> Path:
    """save_pretrained the base model (config.json + model.safetensors) to `path`."""
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_adapter(base, path: Path, seed: int, **lora_kwargs) -> Path:
    """Build a PEFT LoRA over a copy of `base` with random nonzero A and B; save it to `path`."""
    import copy

    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(**lora_kwargs)
    model = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(path)
    return path


# -- synthetic adapters for kernel / pool tests (no peft needed) ---------------------------

MODULE_DIMS = {
    "q_proj": (64, 64),
    "k_proj": (64, 32),
    "v_proj": (64, 32),
    "o_proj": (64, 64),
    "gate_proj": (64, 96),
    "up_proj": (64, 96),
    "down_proj": (96, 64),
}


def llama_specs(num_layers: int = 2, dims: dict | None = None):
    """LoraLinearSpecs laid out as the engine's Llama fuses them (qkv, o, gate_up, down)."""
    from loraplex.adapters.device_pool import LoraLinearSpec

    d = dims or MODULE_DIMS
    specs = []
    for layer in range(num_layers):
        for names in (
            ("q_proj", "k_proj", "v_proj"),
            ("o_proj",),
            ("gate_proj", "up_proj"),
            ("down_proj",),
        ):
            specs.append(
                LoraLinearSpec(layer, names, d[names[0]][0], tuple(d[n][1] for n in names))
            )
    return specs


def random_adapter(
    key: str,
    ranks: dict,
    seed: int,
    num_layers: int = 2,
    dims: dict | None = None,
    dtype=torch.float32,
):
    """A LoadedAdapter with random A/B: `ranks` maps module name -> rank (absent = untargeted)."""
    from loraplex.adapters.targets import ModuleTarget, ResolvedTargets
    from loraplex.adapters.weights import LoadedAdapter, ModuleLora

    d = dims or MODULE_DIMS
    gen = torch.Generator().manual_seed(seed)
    modules = {}
    for layer in range(num_layers):
        for name, r in ranks.items():
            din, dout = d[name]
            modules[(layer, name)] = ModuleLora(
                a=(torch.randn(r, din, generator=gen) * 0.1).to(dtype),
                b=(torch.randn(dout, r, generator=gen) * 0.1).to(dtype),
                scale=float(torch.rand((), generator=gen)) * 2 + 0.25,
            )
    targets = ResolvedTargets(
        {k: ModuleTarget(m.rank, m.scale * m.rank, m.scale) for k, m in modules.items()}
    )
    return LoadedAdapter(key=key, targets=targets, modules=modules)


def reference_delta(x, adapters_per_token, spec):
    """Per-token oracle: delta[t, slice] = scale * B (A x[t]) from the adapter's own matrices."""
    out = torch.zeros(x.shape[0], spec.out_features, dtype=torch.float64)
    for t, ad in enumerate(adapters_per_token):
        if ad is None:
            continue
        for si, name in enumerate(spec.slice_names):
            m = ad.modules.get((spec.layer_idx, name))
            if m is None:
                continue
            off, size = spec.slice_offsets[si], spec.slice_sizes[si]
            d = m.b.double() @ (m.a.double() @ x[t].double())
            out[t, off : off + size] += m.scale * d
    return out
