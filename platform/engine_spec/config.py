"""EngineConfig: every knob of one engine replica, with its one default, validated once.

Torch-free on purpose: the control plane (launchers, `up`, deployments) builds and checks an
EngineConfig without importing the engine. Each field's `metadata["help"]` documents it and
becomes its command-line help (`engine_spec.cli` generates the options from these fields);
a field with `metadata["cli"] = False` never goes on a command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loraplex.loader.storage import StorageConfig
from loraplex.platform.engine_spec.quantization import (
    AUTO,
    KV_CACHE_CHOICES,
    QUANTIZED_ON_LOAD,
)
from loraplex.platform.engine_spec.speculative import parse_speculative, speculative_gap

DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = KV_CACHE_CHOICES
"""`auto` stores K/V in the model's dtype; `fp8` in e4m3 with per-layer scales (half the
bytes of bf16: about twice the blocks in the same memory)."""


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def deterministic_gap(
    quantization: str | None,
    kv_cache_dtype: str,
    ep_size: int = 1,
    device: str = "cpu",
    dtype: str = "float32",
    model_config: Mapping[str, Any] | None = None,
) -> str | None:
    """What of these choices the deterministic mode does not cover yet, None when it covers
    them all (the one rule: `EngineConfig` and the control plane both ask it). With the base
    model's config (`config.json` as a dict) it also answers for the architecture."""
    if model_config is not None and uses_latent_attention(model_config):
        return (
            "multi-head latent attention (MLA: DeepSeek-V2/V3; its latent-cache attention has "
            "no fixed-order kernel)"
        )
    if not device.startswith("cpu"):
        return f"device {device} (the GPU kernels' single-tile configuration is not built)"
    if quantization not in (None, AUTO, "fp32", "bf16", *QUANTIZED_ON_LOAD):
        return f"quantization {quantization} (pre-quantized checkpoints' GEMMs are not covered)"
    if kv_cache_dtype != "auto":
        return f"kv_cache_dtype {kv_cache_dtype}"
    if dtype == "float16" and quantization is None:
        return "dtype float16 (fp32 and bf16 only)"
    if ep_size > 1:
        return "expert parallelism"
    return None


def uses_latent_attention(model_config: Mapping[str, Any]) -> bool:
    """Whether a model config describes multi-head latent attention (a compressed KV rank)."""
    return model_config.get("kv_lora_rank") is not None or model_config.get("model_type") in (
        "deepseek_v2",
        "deepseek_v3",
    )


@dataclass
class EngineConfig:
    """Settings of one engine: model, KV cache sizing, batching, caching, LoRA slots, expert
    parallelism (see each field's help).

    `num_gpu_blocks` fixes the KV block count; otherwise it comes from
    `kv_cache_memory_bytes` (or, on a GPU, `gpu_memory_utilization` of free memory).
    `model` is a local folder or `s3://bucket/prefix` (streamed with `storage`, which the server
    builds from the environment, never from the command line). `quantization` casts the
    weights on the way in (fp32 | bf16 | fp16, overriding `dtype`) or stores the Linear weights
    quantized (int8 | int4 | int4_sym | fp8; the rest and the activations stay in `dtype`). `kv_cache_dtype` fp8
    stores the KV cache in e4m3.
    """

    model: str = field(metadata={"help": "local HuggingFace folder or s3://BUCKET/PREFIX"})
    dtype: str = _opt(
        "float32", "compute dtype when no quantization is given; auto: bfloat16 where the device "
        "computes it natively (CUDA, CPUs with AVX512_BF16 or AMX), else float32",
    )  # fmt: skip
    device: str = _opt("cpu", "torch device, e.g. cpu or cuda:0")
    block_size: int = _opt(16, "tokens per KV-cache block (a power of two)")
    num_gpu_blocks: int | None = _opt(None, "fixed KV-cache block count (else from memory)")
    kv_cache_memory_bytes: int | None = _opt(None, "bytes for the KV cache")
    cpu_kv_cache_bytes: int = _opt(
        256 << 20, "bytes for a CPU engine's KV cache when kv_cache_memory_bytes is unset (at "
        "most what 2 x max_num_seqs full-length sequences need)",
    )  # fmt: skip
    gpu_memory_utilization: float = _opt(0.9, "share of free GPU memory for the KV cache")
    max_num_seqs: int = _opt(64, "sequences in one step, at most")
    max_num_batched_tokens: int = _opt(2048, "tokens in one step, at most")
    shared_prefill_s: float = _opt(
        0.025, "while more than one tenant has work, a step's prefill chunks are sized to add "
        "about this long to it (their cost per token fitted from recent steps; a step is every "
        "running request's wait); 0: always up to max_num_batched_tokens",
    )  # fmt: skip
    max_model_len: int | None = _opt(None, "context length (default: the model's)")
    enable_prefix_caching: bool = _opt(True, "share KV blocks of equal prefixes")
    enable_chunked_prefill: bool = _opt(True, "split long prompts over several steps")
    seed: int = _opt(0, "sampler seed")
    model_id: str | None = _opt(None, "model identity in prefix-cache keys and /state")
    tokenizer: str | None = _opt(None, "tokenizer folder (default: the model's)")
    max_loras: int = _opt(
        256, "distinct adapters in one step, a cap (0: no multi-LoRA runtime); memory is the "
        "adapter_memory budget's",
    )  # fmt: skip
    max_lora_rank: int = _opt(64, "largest adapter rank served")
    adapter_memory_bytes: int | None = _opt(
        None, "device bytes for adapter weights (default: adapter_memory_rank_rows rank rows)"
    )
    adapter_memory_rank_rows: int = _opt(
        2048, "device adapter memory in rank rows when adapter_memory_bytes is unset, at most "
        "max_loras x max_lora_rank (2048 rows: 256 rank-8 or 32 rank-64 adapters resident)",
    )  # fmt: skip
    expert_lora_memory_bytes: int | None = _opt(
        None, "device bytes (per expert-parallel rank) for adapters' expert and router LoRA "
        "factors on a MoE base, counted in admission (default: max_loras adapters of "
        "max_lora_rank on every expert target); refused on a dense base",
    )  # fmt: skip
    adapter_max_bytes: int = _opt(
        512 << 20, "largest adapter file (adapter_config.json or adapter_model.safetensors) "
        "fetched from object storage; a bigger one is refused before it is read",
    )  # fmt: skip
    lora_max_wait_steps: int = _opt(
        32, "engine steps a ready adapter may wait for a batch slot before admission lets no "
        "other adapter ahead of it (no adapter starves)",
    )  # fmt: skip
    quantization: str | None = _opt(
        None,
        "weights on load: fp32, bf16, fp16 (casts, setting the compute dtype), or int8 "
        "(W8A16), int4 / int4_sym (W4A16, groups of 128), fp8 (W8A8 e4m3), computing in dtype",
    )
    kv_cache_dtype: str = _opt("auto", "KV cache storage: auto (the model's dtype) or fp8 (e4m3)")
    cpu_threads: int | None = _opt(
        None, "torch intra-op threads of a CPU engine's process (default: torch's, every core); "
        "1 avoids a thread barrier per op, far faster for small models on a shared machine",
    )  # fmt: skip
    enforce_eager: bool = _opt(False, "never capture decode CUDA graphs")
    cuda_graph_sizes: list[int] | None = _opt(
        None, "decode batch sizes to capture, e.g. 1,2,4,8 (default: 1,2,4,8,16,... max_num_seqs)"
    )
    ep_size: int = _opt(1, "expert-parallel ranks (spawned processes; MoE models)")
    ep_redundant_experts: int = _opt(
        0, "extra copies of hot experts placed at each rebalance (EPLB)"
    )
    eplb_interval: int = _opt(0, "engine steps between expert rebalances (0: never)")
    deterministic: bool = _opt(
        False, "bitwise-reproducible logprobs whatever the batch, chunking, prefix cache or "
        "neighbours' adapters (batch-invariant kernels; dense and MoE models in fp32/bf16 or "
        "quantized on load (int8, int4, fp8), on a CPU)",
    )  # fmt: skip
    speculative: str | None = _opt(
        None, 'speculative decoding as JSON, e.g. {"method": "ngram", "k_min": 0, "k_max": 5} '
        "(ngram: prompt lookup plus each adapter's past outputs); not with ep_size > 1; "
        "requests with structured output draft by prompt lookup, under their grammar",
    )  # fmt: skip
    storage: StorageConfig | None = field(
        default=None, repr=False, compare=False, metadata={"cli": False}
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a path")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.cpu_kv_cache_bytes < 1:
            raise ValueError("cpu_kv_cache_bytes must be positive")
        if self.adapter_max_bytes < 1:
            raise ValueError(f"adapter_max_bytes must be positive, got {self.adapter_max_bytes}")
        if self.lora_max_wait_steps < 0:
            raise ValueError("lora_max_wait_steps must be >= 0")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.shared_prefill_s < 0:
            raise ValueError("shared_prefill_s must be >= 0")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if self.max_loras < 0 or self.max_lora_rank < 0:
            raise ValueError("max_loras and max_lora_rank must be >= 0")
        if self.adapter_memory_bytes is not None and self.adapter_memory_bytes < 1:
            raise ValueError("adapter_memory_bytes must be positive")
        if self.expert_lora_memory_bytes is not None and self.expert_lora_memory_bytes < 1:
            raise ValueError("expert_lora_memory_bytes must be positive")
        if self.adapter_memory_rank_rows < 1:
            raise ValueError("adapter_memory_rank_rows must be >= 1")
        if self.cuda_graph_sizes is not None and (
            not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1
        ):
            raise ValueError("cuda_graph_sizes must be a non-empty list of sizes >= 1")
        if self.ep_size < 1:
            raise ValueError(f"ep_size must be >= 1, got {self.ep_size}")
        if self.ep_redundant_experts < 0 or self.eplb_interval < 0:
            raise ValueError("ep_redundant_experts and eplb_interval must be >= 0")
        why = self.deterministic_refusal()
        if why is not None:
            raise ValueError(f"the deterministic mode does not cover {why} yet")
        if self.speculative is not None:  # canonical text, so a command line round-trips
            option = parse_speculative(self.speculative)
            gap = speculative_gap(option, self.ep_size)
            if gap is not None:
                raise ValueError(f"speculative decoding does not serve {gap}")
            self.speculative = option.to_json()

    def deterministic_refusal(self, model_config: Mapping[str, Any] | None = None) -> str | None:
        """What of this configuration the deterministic mode does not cover yet (None: all
        of it, as far as the configuration and `model_config`, the base's config.json once
        loaded, tell; the engine checks the model's modules too)."""
        if not self.deterministic:
            return None
        return deterministic_gap(
            self.quantization,
            self.kv_cache_dtype,
            self.ep_size,
            self.device,
            self.dtype,
            model_config,
        )

    def adapter_rank_rows(self) -> int:
        """Rank rows of device adapter memory when no byte budget is given: the rows budget,
        capped by what `max_loras` adapters of `max_lora_rank` could use, and enough for one
        adapter of `max_lora_rank`."""
        cap = self.max_loras * self.max_lora_rank
        return max(self.max_lora_rank, min(self.adapter_memory_rank_rows, cap))

    @property
    def serves_adapters(self) -> bool:
        """Whether this engine runs the multi-LoRA runtime (adapters need slots)."""
        return self.max_loras > 0

    def check_model_len(self, model_max_len: int) -> None:
        """Fill `max_model_len` from the model when unset and check the batching budget fits it."""
        if self.max_model_len is None:
            self.max_model_len = model_max_len
        if self.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={model_max_len}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "with chunked prefill off, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
            )


def engine_default(name: str) -> Any:
    """The default of EngineConfig field `name` (the one place engine defaults live)."""
    for f in dataclasses.fields(EngineConfig):
        if f.name == name:
            if f.default is dataclasses.MISSING:
                raise KeyError(f"EngineConfig.{name} has no default")
            return f.default
    raise KeyError(f"EngineConfig has no field {name!r}")
