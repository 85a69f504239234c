"""AWQ and GPTQ checkpoints packed by the formats' own libraries (the oracles' packers):
AutoAWQ's `WQLinear_GEMM.from_linear` and AutoGPTQ's `QuantLinear.pack` (its `cuda` module's
pure-torch packer, which honours `g_idx`), from known codes, scales and zero points; plus the
transformers model holding the closed-form dequantized weights w = (q - z) * s (the reference).

Both libraries are imported module by module, without their package `__init__`, which pulls in
their model zoos and calibration stacks (datasets; transformers 4 names): only the packers and
layers are used, on CPU, no CUDA extension. `make` installs them with `--no-deps`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

GROUP = 128
# variant -> (quant_method, symmetric, act_order)
VARIANTS = {
    "awq": ("awq", False, False),
    "gptq_sym": ("gptq", True, False),
    "gptq_asym_act_order": ("gptq", False, True),
    "gptq_sym_act_order": ("gptq", True, True),
}
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def libraries_installed() -> bool:
    """Whether AutoAWQ and AutoGPTQ are installed (found without importing them; a package
    `library_module` already put in place as a bare namespace has no spec to find)."""
    return all(
        p in sys.modules or importlib.util.find_spec(p) is not None for p in ("awq", "auto_gptq")
    )


def library_module(dotted: str) -> types.ModuleType:
    """Import `dotted` (e.g. `awq.modules.linear.gemm`) with its parent packages as bare
    namespaces, so their `__init__` (model zoos, datasets) never runs."""
    parts = dotted.split(".")
    if dotted in sys.modules:
        return sys.modules[dotted]
    if parts[0] in sys.modules:
        root = Path(next(iter(sys.modules[parts[0]].__path__)))
    else:
        spec = importlib.util.find_spec(parts[0])
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{parts[0]} is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
            sys.modules[name] = pkg
    return importlib.import_module(dotted)


def _known_quantization(
    weight: torch.Tensor, gen: torch.Generator, symmetric: bool, g_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes q [out, in] (0..15), fp16-exact scales s and integer zeros z [out, groups] near
    `weight`'s range; GPTQ's format stores z - 1, so asymmetric zeros stay in 1..15."""
    out, inp = weight.shape
    groups = inp // GROUP
    amax = torch.zeros(out, groups).scatter_reduce_(
        1, g_idx.expand(out, -1), weight.abs().float(), "amax"
    )
    scale = (amax / 7.5).clamp(min=1e-3).half().float()
    zero = (
        torch.full((out, groups), 8.0)
        if symmetric
        else torch.randint(1, 16, (out, groups), generator=gen).float()
    )
    codes = torch.randint(0, 16, (out, inp), generator=gen).float()
    return codes, scale, zero


def _dequantized(codes, scale, zero, g_idx) -> torch.Tensor:
    return (codes - zero[:, g_idx]) * scale[:, g_idx]


def _check_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = ((got.float() - want.float()).abs().max() / want.abs().max()).item()
    assert err < 2e-3, f"{what} disagrees with the weight it packed (rel err {err:.2e})"


def _awq_tensors(linear: torch.nn.Linear, scale, zero) -> dict[str, torch.Tensor]:
    gemm = library_module("awq.modules.linear.gemm")
    q = gemm.WQLinear_GEMM.from_linear(
        linear, 4, GROUP, scales=scale.t().contiguous(), zeros=zero.t().contiguous()
    )
    # the library's own reading of what it packed must be the weight it was given
    unpack = library_module("awq.utils.packing_utils")
    w = unpack.dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, GROUP).t().float()
    _check_close(w, linear.weight, "AWQ's dequantize_gemm")
    return {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales.half()}


def _gptq_tensors(linear: torch.nn.Linear, scale, zero, g_idx) -> dict[str, torch.Tensor]:
    cuda = library_module("auto_gptq.nn_modules.qlinear.qlinear_cuda")
    out, inp = linear.weight.shape
    q = cuda.QuantLinear(4, GROUP, inp, out, bias=False, weight_dtype=torch.float32)
    q.pack(linear, scale, zero, g_idx.to(torch.int32))
    x = torch.randn(3, inp, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the library's own CPU forward reads its checkpoint as the weight
        _check_close(q(x), x @ linear.weight.t(), "AutoGPTQ's QuantLinear forward")
    return {
        "qweight": q.qweight,
        "qzeros": q.qzeros,
        "scales": q.scales.half(),
        "g_idx": q.g_idx.to(torch.int32),
    }


def quantization_config(variant: str) -> dict:
    """The `quantization_config` the format's library writes for `variant`."""
    method, symmetric, act_order = VARIANTS[variant]
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order,
            "sym": symmetric, "damp_percent": 0.01, "static_groups": False,
            "true_sequential": True, "checkpoint_format": "gptq",
            "model_file_base_name": "model"}  # fmt: skip


def save_awq_gptq(
    hf: torch.nn.Module, src: Path, out: Path, variant: str, seed: int = 0
) -> torch.nn.Module:
    """Quantize every decoder Linear of `hf` (saved at `src`) as `variant` with the library's
    packer, write the checkpoint folder `out`; returns the dequantized reference model."""
    method, symmetric, act_order = VARIANTS[variant]
    gen = torch.Generator().manual_seed(seed)
    ref = copy.deepcopy(hf).float().eval()
    tensors = {k: v.detach().clone().contiguous() for k, v in ref.state_dict().items()}
    orders: dict[str, torch.Tensor] = {}
    for name, mod in ref.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in _PROJ:
            continue
        inp = mod.in_features
        key = name.rsplit(".", 1)[0] + "." + _SHARED_INPUT.get(leaf, leaf)
        if act_order:  # GPTQ quantizes the inputs in one order per input (q/k/v share it)
            perm = orders.setdefault(key, torch.randperm(inp, generator=gen))
            g_idx = torch.empty(inp, dtype=torch.int64)
            g_idx[perm] = torch.arange(inp) // GROUP
        else:
            g_idx = torch.arange(inp) // GROUP
        codes, scale, zero = _known_quantization(mod.weight.data, gen, symmetric, g_idx)
        with torch.no_grad():
            mod.weight.copy_(_dequantized(codes, scale, zero, g_idx))
        packed = (
            _awq_tensors(mod, scale, zero)
            if method == "awq"
            else _gptq_tensors(mod, scale, zero, g_idx)
        )
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.{k}": v.contiguous() for k, v in packed.items()})
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("model") and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(variant)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return ref
