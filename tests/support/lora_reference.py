"""Synthetic adapters for the kernel and device-pool tests (no peft): LoraLinearSpecs laid out
as the engine's Llama fuses them, random `LoadedAdapter`s, and the per-token reference delta.
"""

from __future__ import annotations

import torch

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
