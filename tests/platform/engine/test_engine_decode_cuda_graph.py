"""GPU only: the decode-only forward has no host sync and replays from a captured CUDA graph
with the same logits as eager execution. Skipped on machines without CUDA."""

from __future__ import annotations

import pytest
import torch
from support.paged_harness import PagedHarness

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.platform.engine.forward_context import ForwardContext, forward_context
from loraplex.platform.engine.model_loading import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _decode_inputs(h: PagedHarness, seqs: list[str], next_tokens: list[int]):
    return h.build([(s, [t]) for s, t in zip(seqs, next_tokens, strict=True)])


@torch.no_grad()
def test_decode_step_is_graph_capturable(tmp_path):
    pytest.importorskip("triton")
    save_tiny_model(tmp_path, "llama", with_tokenizer=False)
    model = load_model(tmp_path, dtype="float32", device="cuda")
    h = PagedHarness(model, num_blocks=64, block_size=4, device="cuda")
    seqs = ["a", "b", "c"]
    h.step([("a", list(range(3, 14))), ("b", list(range(20, 26))), ("c", [50, 51])])

    # static buffers sized for the widest table the replays will need
    width = 8
    ids, pos, md = _decode_inputs(h, seqs, [7, 8, 9])
    static_ids, static_pos = ids.clone(), pos.clone()
    static_bt = torch.zeros(len(seqs), width, dtype=torch.int32, device="cuda")
    static_bt[:, : md.block_tables.shape[1]] = md.block_tables
    md.block_tables = static_bt
    md.max_seq_len = width * h.block_size
    static_md = md

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the decode path raises
    try:
        with forward_context(ForwardContext(attn=static_md)):
            eager = model.compute_logits(model(static_ids, static_pos))
    finally:
        torch.cuda.set_sync_debug_mode("default")

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), forward_context(ForwardContext(attn=static_md)):
        model(static_ids, static_pos)  # warm-up on the side stream
        with torch.cuda.graph(graph):
            static_hidden = model(static_ids, static_pos)
    torch.cuda.current_stream().wait_stream(stream)

    # next step: new tokens, positions, slots and lengths copied into the same buffers
    ids2, pos2, md2 = _decode_inputs(h, seqs, [10, 11, 12])
    static_ids.copy_(ids2)
    static_pos.copy_(pos2)
    static_md.slot_mapping.copy_(md2.slot_mapping)
    static_md.seq_lens.copy_(md2.seq_lens)
    static_md.context_lens.copy_(md2.context_lens)
    static_bt.zero_()
    static_bt[:, : md2.block_tables.shape[1]] = md2.block_tables
    graph.replay()
    replayed = model.compute_logits(static_hidden)

    md2.max_seq_len = width * h.block_size
    with forward_context(ForwardContext(attn=md2)):
        reference = model.compute_logits(model(ids2, pos2))
    torch.testing.assert_close(replayed, reference, atol=1e-4, rtol=0)
    assert eager.shape == reference.shape
