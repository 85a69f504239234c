"""CUDA graphs for the engine's decode step: capture after load, replay for decode-only batches.

On a GPU the decode forward (static inputs, no host sync) is captured with the loader's
`CudaGraphRunner` for a list of batch sizes (vLLM-like 1, 2, 4, 8, 16, ... up to
`max_num_seqs`, or `EngineConfig.cuda_graph_sizes`), largest first in one memory pool. Each
replay is installed in `ModelRunner.decode_graphs`, so a decode-only step of n requests is
padded to the next captured size (the model runner's `prepare_decode_inputs` writes the padding)
and replayed. The graphs hold the base model only: a step that carries LoRA metadata runs eager.
On CPU, with `enforce_eager`, under expert parallelism, or when capture fails (a layer that
syncs with the host) nothing is captured: the timeline records graph capture as skipped, with
why, and every step runs eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from loraplex.loader.cuda_graphs import CudaGraphRunner, GraphInput, default_capture_sizes
from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from loraplex.platform.engine.config import EngineConfig
    from loraplex.platform.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)


def capture_sizes(config: EngineConfig) -> list[int]:
    """The decode batch sizes to capture, largest first, none above `max_num_seqs`."""
    if config.cuda_graph_sizes is None:
        return default_capture_sizes(config.max_num_seqs)
    sizes = {s for s in config.cuda_graph_sizes if s <= config.max_num_seqs}
    return sorted(sizes or {config.max_num_seqs}, reverse=True)


def eager_reason(config: EngineConfig, device: torch.device) -> str | None:
    """Why this engine runs its decode step eager, or None when it captures graphs."""
    if config.enforce_eager:
        return "enforce_eager is set"
    if device.type != "cuda":
        return f"device is {device.type}; CUDA graphs need a GPU"
    if not CudaGraphRunner.available():
        return "CUDA is not available"
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return "expert parallelism exchanges tokens with host-side counts"
    return None


def decode_graph_inputs(runner: ModelRunner) -> list[GraphInput]:
    """The decode step's inputs, one row per sequence, with the padding values of empty rows."""
    return [
        GraphInput("input_ids", (), torch.int64, 0),
        GraphInput("positions", (), torch.int64, 0),
        GraphInput("slot_mapping", (), torch.int64, -1),  # -1: padding writes no KV
        GraphInput("seq_lens", (), torch.int32, 1),
        GraphInput("context_lens", (), torch.int32, 0),
        GraphInput("block_tables", (runner.max_blocks_per_seq,), torch.int32, 0),
    ]


def make_decode_step(runner: ModelRunner) -> Callable[..., torch.Tensor]:
    """The base-model decode forward over its inputs -> logits [B, V] (capturable)."""

    def step(
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        seq_lens: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
    ) -> torch.Tensor:
        b = ids.shape[0]
        md = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=runner.decode_query_start_loc[: b + 1],
            seq_lens=seq_lens,
            context_lens=context_lens,
            block_tables=block_tables,
            max_query_len=1,
            max_seq_len=runner.max_model_len,
            is_decode_only=True,
        )
        with forward_context(ForwardContext(attn=md)):
            return runner.model.compute_logits(runner.model(ids, positions))

    return step


def _replay(graphs: CudaGraphRunner, runner: ModelRunner, b: int) -> Callable[[], torch.Tensor]:
    """A `decode_graphs` entry: copy the runner's prepared rows in and replay size `b`."""

    @torch.inference_mode()  # the static buffers were made in inference mode
    def replay() -> torch.Tensor:
        if runner.lora_metadata is not None:  # the graphs hold the base model only
            return runner.run_decode_step(b)
        return graphs.run(
            runner.decode_input_ids[:b],
            runner.decode_positions[:b],
            runner.decode_slot_mapping[:b],
            runner.decode_seq_lens[:b],
            runner.decode_context_lens[:b],
            runner.decode_block_tables[:b],
        )

    return replay


@torch.inference_mode()
def capture_decode_graphs(
    runner: ModelRunner, sizes: Sequence[int], timeline: Timeline | None = None
) -> CudaGraphRunner:
    """Capture the decode step for `sizes` and install the replays in `runner.decode_graphs`."""
    graphs = CudaGraphRunner(
        make_decode_step(runner),
        decode_graph_inputs(runner),
        sizes,
        device=runner.device,
        timeline=timeline,
    )
    graphs.capture()
    for b in graphs.sizes:
        runner.decode_graphs[b] = _replay(graphs, runner, b)
    return graphs


def setup_decode_graphs(
    runner: ModelRunner, config: EngineConfig, timeline: Timeline
) -> CudaGraphRunner | None:
    """Capture the decode graphs where they apply; otherwise record why the engine runs eager."""
    reason = eager_reason(config, runner.device)
    if reason is not None:
        timeline.skip("warmup", reason)
        timeline.skip("graph_capture", reason)
        log.info("decode step runs eager: %s", reason)
        return None
    sizes = capture_sizes(config)
    try:
        graphs = capture_decode_graphs(runner, sizes, timeline)
    except Exception as exc:  # e.g. a layer that syncs with the host: serve eager instead
        runner.decode_graphs.clear()
        torch.cuda.synchronize(runner.device)
        reason = f"capture failed: {type(exc).__name__}: {exc}"
        timeline.skip("graph_capture", reason)
        log.warning("decode step runs eager, %s", reason)
        return None
    log.info("captured decode CUDA graphs for batch sizes %s", graphs.sizes)
    return graphs
