"""CUDA graphs for the engine's decode step: capture after load, replay for decode-only batches.

On a GPU the decode forward (static inputs, no host sync) is captured with `cuda_graphs`'s
`CudaGraphRunner` for a list of batch sizes (vLLM-like 1, 2, 4, 8, 16, ... up to
`max_num_seqs`, or `EngineConfig.cuda_graph_sizes`), largest first in one memory pool. Each
replay is installed in `ModelRunner.decode_graphs`, so a decode-only step of n requests is
padded to the next captured size (the model runner's `prepare_decode_inputs` writes the padding)
and replayed.

With a LoRA runtime installed the graphs are captured with adapters active: the forward context
of the captured step holds a view of persistent `StaticLoraMeta` buffers, so every
LoRA-targeted Linear records the graph-static Triton shrink/expand (grid from the padded batch,
`max_loras` and `max_lora_rank` only). Before each replay the step's `LoraBatchMeta` is copied
into those buffers (rows past the live batch: slot -1). Base-only steps replay the same graphs
with every slot -1 (all LoRA programs exit at once): one capture, one pool, and half the
cold-start capture time of keeping separate base graphs. Installing a runtime after the engine
captured its base graphs recaptures them (`recapture_decode_graphs`).

On CPU, with `enforce_eager`, under expert parallelism, or when capture fails (a layer that
syncs with the host) nothing is captured: the timeline records graph capture as skipped, with
why, and every step runs eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from loraplex.adapters.metadata import LoraBatchMeta
from loraplex.adapters.static_meta import StaticLoraMeta
from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.cuda_graphs import CudaGraphRunner, GraphInput, default_capture_sizes
from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.layers.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from loraplex.platform.engine.model_runner import ModelRunner
    from loraplex.platform.engine_spec.config import EngineConfig

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


def static_lora_meta(runner: ModelRunner, max_batch: int) -> StaticLoraMeta | None:
    """Static LoRA buffers for graphs of up to `max_batch` rows, or None without a runtime
    (the runtime allocates what a captured graph bakes in before the capture)."""
    runtime = runner.lora_runtime
    return None if runtime is None else runtime.static_lora_meta(max_batch)


def make_decode_step(
    runner: ModelRunner, static_lora: StaticLoraMeta | None = None
) -> Callable[..., torch.Tensor]:
    """The decode forward over its inputs -> logits [B, V] (capturable).

    With `static_lora`, the LoRA-targeted Linears read its first B rows (graph-static
    metadata) and run the graph-static delta.
    """

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
        lora = static_lora.view(b) if static_lora is not None else None
        with forward_context(ForwardContext(attn=md, lora=lora)):
            return runner.compute_logits(runner.model(ids, positions))

    return step


def load_static_lora(static_lora: StaticLoraMeta | None, meta: object, b: int) -> bool:
    """Put a step's LoRA metadata into the static buffers for a replay of size `b`.

    Returns False when the graphs cannot serve it (base-only graphs and adapters, or metadata
    of another kind): the step then runs eager.
    """
    if meta is None:
        if static_lora is not None:
            static_lora.clear()
        return True
    if static_lora is None or not isinstance(meta, LoraBatchMeta):
        return False
    static_lora.copy_from(meta, b)
    return True


def _replay(
    graphs: CudaGraphRunner,
    runner: ModelRunner,
    b: int,
    static_lora: StaticLoraMeta | None = None,
) -> Callable[[], torch.Tensor]:
    """A `decode_graphs` entry: copy the runner's prepared rows (and LoRA metadata) in, replay."""

    @torch.inference_mode()  # the static buffers were made in inference mode
    def replay() -> torch.Tensor:
        if not load_static_lora(static_lora, runner.lora_metadata, b):
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
    """Capture the decode step for `sizes` (with LoRA when the runner has a runtime) and
    install the replays in `runner.decode_graphs`."""
    static_lora = static_lora_meta(runner, max(sizes))
    graphs = CudaGraphRunner(
        make_decode_step(runner, static_lora),
        decode_graph_inputs(runner),
        sizes,
        device=runner.device,
        timeline=timeline,
    )
    graphs.capture()
    for b in graphs.sizes:
        runner.decode_graphs[b] = _replay(graphs, runner, b, static_lora)
    runner.decode_graphs_have_lora = static_lora is not None
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
        runner.decode_graphs_have_lora = False
        torch.cuda.synchronize(runner.device)
        reason = f"capture failed: {type(exc).__name__}: {exc}"
        timeline.skip("graph_capture", reason)
        log.warning("decode step runs eager, %s", reason)
        return None
    log.info("captured decode CUDA graphs for batch sizes %s", graphs.sizes)
    return graphs


def recapture_decode_graphs(
    runner: ModelRunner, config: EngineConfig, timeline: Timeline
) -> CudaGraphRunner | None:
    """Drop the current decode graphs and capture again (after a LoRA runtime is installed,
    so adapter steps replay too); a no-op returning None where the engine runs eager."""
    if eager_reason(config, runner.device) is not None:
        return None
    runner.decode_graphs.clear()
    runner.decode_graphs_have_lora = False
    torch.cuda.synchronize(runner.device)
    return setup_decode_graphs(runner, config, timeline)
