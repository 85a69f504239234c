"""`loraplex demo adapter`: a small valid PEFT LoRA adapter for a Llama-layout model (the demo
model by default) written with numpy and safetensors only, so a new operator can try adapter
upload and serving without peft or any Python of their own.

The files are what `peft`'s `save_pretrained` writes for a LoRA on a LlamaForCausalLM:
`adapter_config.json` and `adapter_model.safetensors` with tensors named
`base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight`. B is random
and non-zero (peft starts it at zero), so the adapter visibly changes the model's outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_TARGETS = ATTENTION + MLP
DEFAULT_TARGETS = ("q_proj", "v_proj")
B_STD = 0.05

# The demo model's shape (platform/demo_model.py), repeated here so writing the adapter needs
# no torch; tests check the two agree.
DEMO_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
}


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a Llama-layout model that a LoRA's tensors depend on."""

    hidden: int
    intermediate: int
    layers: int
    q_out: int
    kv_out: int

    @classmethod
    def from_config(cls, config: dict) -> LlamaShape:
        """From a HuggingFace config.json's fields."""
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        return cls(
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            q_out=heads * head_dim,
            kv_out=kv_heads * head_dim,
        )

    def dims(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a projection."""
        return {
            "q_proj": (self.hidden, self.q_out),
            "k_proj": (self.hidden, self.kv_out),
            "v_proj": (self.hidden, self.kv_out),
            "o_proj": (self.q_out, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }[module]


def model_shape(model_dir: Path | None) -> LlamaShape:
    """The shape of the model at `model_dir` (its config.json), or of the demo model."""
    if model_dir is None:
        return LlamaShape.from_config(DEMO_SHAPE)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return LlamaShape.from_config(config)


def lora_tensors(
    shape: LlamaShape, rank: int, targets: tuple[str, ...], seed: int
) -> dict[str, np.ndarray]:
    """Random A (scaled by 1/sqrt(in)) and non-zero B for each targeted projection."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(shape.layers):
        for module in targets:
            block = "self_attn" if module in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            fan_in, fan_out = shape.dims(module)
            a = rng.standard_normal((rank, fan_in), dtype=np.float32) / np.sqrt(fan_in)
            b = rng.standard_normal((fan_out, rank), dtype=np.float32) * B_STD
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float32)
    return tensors


def adapter_config(rank: int, alpha: float, targets: tuple[str, ...], base: str) -> dict:
    """The adapter_config.json peft writes for this LoRA."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def write_demo_adapter(
    out: Path,
    *,
    model_dir: Path | None = None,
    rank: int = 8,
    alpha: float | None = None,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
    seed: int = 0,
    base_name: str = "demo",
) -> Path:
    """Write adapter_config.json and adapter_model.safetensors to `out`; return `out`."""
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    unknown = sorted(set(targets) - set(ALL_TARGETS))
    if unknown or not targets:
        raise ValueError(f"targets must be some of {', '.join(ALL_TARGETS)}; got {unknown}")
    shape = model_shape(model_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        lora_tensors(shape, rank, tuple(targets), seed),
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    config = adapter_config(
        rank, float(alpha if alpha is not None else 2 * rank), targets, base_name
    )
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
