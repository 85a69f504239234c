"""EngineConfig: every knob of one engine replica, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loraplex.platform.settings import Settings


@dataclass
class EngineConfig:
    """Settings of one engine: model, KV cache sizing, batching limits, caching switches.

    `num_gpu_blocks` fixes the KV block count; otherwise it comes from
    `kv_cache_memory_bytes` (or, on a GPU, `gpu_memory_utilization` of free memory).
    `max_loras`, `max_lora_rank` and `adapter_memory_bytes` are stored for the
    multi-LoRA runtime; the engine itself does not read them.

    `model` is a local folder or `s3://bucket/prefix` (streamed with the object store named by
    `settings`). `quantization` (fp32 | bf16 | fp16) casts the weights on the way in and sets
    the dtype the model runs in (it overrides `dtype`); int8, fp8 and int4 are refused. On a
    GPU the decode step is captured as CUDA graphs for `cuda_graph_sizes` (default 1, 2, 4,
    8, 16, ... up to `max_num_seqs`) unless `enforce_eager`.
    """

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    model_id: str | None = None
    tokenizer: str | None = None
    max_loras: int = 8
    max_lora_rank: int = 64
    adapter_memory_bytes: int | None = None
    quantization: str | None = None
    enforce_eager: bool = False
    cuda_graph_sizes: list[int] | None = None
    settings: Settings | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a path")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.max_loras < 0 or self.max_lora_rank < 0:
            raise ValueError("max_loras and max_lora_rank must be >= 0")
        if self.cuda_graph_sizes is not None and (
            not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1
        ):
            raise ValueError("cuda_graph_sizes must be a non-empty list of sizes >= 1")
        from loraplex.platform.engine.weight_quantization import resolve_weight_quantization

        resolve_weight_quantization(self.quantization)  # refuse unknown / unbuilt choices now

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
