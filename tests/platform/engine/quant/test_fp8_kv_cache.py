"""The fp8 (e4m3) KV cache: twice the blocks of a bf16 cache in the same memory, outputs close
to the bf16 cache's, prefix-cache hits and preemption still exact, memory on /state and
/metrics; the torch write/read path round-trips through the per-layer scales."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.paged_harness import PagedHarness  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.layers.paged_attention_torch import (  # noqa: E402
    KVScales,
    decode_attention_torch,
    write_kv_torch,
)

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
MEMORY = 1 << 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fp8kv")
    save_tiny_model(path, "llama", seed=5, with_tokenizer=False)
    return path


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    return [torch.randint(3, 128, (9 + 5 * i,), generator=g).tolist() for i in range(n)]


def test_torch_path_round_trips_fp8_through_its_scales() -> None:
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(20, 2, 16, generator=g) * 30, torch.randn(20, 2, 16, generator=g) * 0.01
    scales = KVScales(k=30 / 64, v=0.01 / 64)
    ref = torch.zeros(2, 8, 4, 2, 16)
    fp8 = torch.zeros(2, 8, 4, 2, 16, dtype=torch.float8_e4m3fn)
    slots = torch.arange(20)
    write_kv_torch(ref, k, v, slots)
    write_kv_torch(fp8, k, v, slots, scales)
    tables = torch.arange(8, dtype=torch.int32).view(2, 4)
    lens = torch.tensor([13, 7], dtype=torch.int32)
    q = torch.randn(2, 4, 16, generator=g)
    want = decode_attention_torch(q, ref, tables, lens, 13, 0.25)
    got = decode_attention_torch(q, fp8, tables, lens, 13, 0.25, scales)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 0.08, err
    unscaled = decode_attention_torch(q, fp8, tables, lens, 13, 0.25)  # scales matter
    assert ((unscaled - want).abs().max() / want.abs().max()).item() > 10 * err


def test_fp8_cache_doubles_blocks_and_keeps_outputs(tiny: Path) -> None:
    common = dict(quantization="bf16", block_size=4, kv_cache_memory_bytes=MEMORY,
                  max_num_seqs=4, max_num_batched_tokens=64, max_loras=0)  # fmt: skip
    auto = LLM(str(tiny), **common)
    fp8 = LLM(str(tiny), kv_cache_dtype="fp8", **common)
    assert fp8.core.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert fp8.core.pool.num_blocks == 2 * auto.core.pool.num_blocks
    state = fp8.core.state()
    assert (state.kv_cache_dtype, state.weight_quantization) == ("fp8", "bf16")
    assert state.kv_cache_bytes == auto.core.state().kv_cache_bytes <= MEMORY
    assert state.weight_bytes == auto.core.state().weight_bytes > 0
    text = fp8.core.metrics.render().decode()
    assert 'loraplex:memory_bytes{dtype="fp8",kind="kv_cache"' in text
    assert "loraplex:kv_cache_num_blocks" in text
    prompts = _prompts(4)
    got = [o.outputs[0].token_ids for o in fp8.generate(prompts, GREEDY)]
    again = fp8.generate(prompts, GREEDY)  # prefix-cache hits read fp8 blocks back
    assert all(o.num_cached_tokens > 0 for o in again)
    assert [o.outputs[0].token_ids for o in again] == got


def test_fp8_cache_logits_stay_close_to_a_float_cache(tiny: Path) -> None:
    model = LLM(str(tiny), max_loras=0, num_gpu_blocks=64, block_size=4).core.model
    runs = {}
    for dtype in (torch.float32, torch.float8_e4m3fn):  # the same model, two caches
        h = PagedHarness(model, num_blocks=64, block_size=4, dtype=dtype)
        out = [torch.cat(h.step([("a", list(range(5, 30))), ("b", list(range(40, 49)))]))]
        out += [torch.cat(h.step([("a", [7 + i]), ("b", [90 - i])])) for i in range(6)]
        runs[dtype] = torch.cat(out)
    want, got = runs[torch.float32], runs[torch.float8_e4m3fn]
    assert model.model.layers[0].self_attn.attn.kv_cache.dtype == torch.float8_e4m3fn
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert 0 < err < 0.1, err
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1 * want.abs().max()
    assert clear.sum() >= 5
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_fp8_cache_survives_preemption(tiny: Path) -> None:
    prompts = _prompts(6)
    roomy = LLM(str(tiny), kv_cache_dtype="fp8", block_size=4, max_num_seqs=6, max_model_len=64,
                max_num_batched_tokens=64, max_loras=0, enable_prefix_caching=False)  # fmt: skip
    want = [o.outputs[0].token_ids for o in roomy.generate(prompts, GREEDY)]
    tight = LLM(str(tiny), kv_cache_dtype="fp8", block_size=4, num_gpu_blocks=20,
                max_model_len=64, max_num_seqs=6, max_num_batched_tokens=64, max_loras=0,
                enable_prefix_caching=False)  # fmt: skip
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)]
    assert tight.core.scheduler.num_preemptions > 0
    assert got == want


def test_per_head_scales_keep_each_head_precise() -> None:
    """Heads of very different magnitudes: one scale per head keeps both exact to e4m3's
    precision, where one per-layer scale (sized for the large head) drowns the small head's
    values in subnormals; decode and prefill read the same per-head scales back."""
    from loraplex.platform.engine.layers.paged_attention_torch import prefill_attention_torch

    g = torch.Generator().manual_seed(3)
    mags = torch.tensor([40.0, 0.001])  # per KV head
    k = torch.randn(24, 2, 16, generator=g) * mags[None, :, None]
    v = torch.randn(24, 2, 16, generator=g) * mags[None, :, None]
    per_head = KVScales(k=mags / 64, v=mags / 64)
    per_layer = KVScales(k=40.0 / 64, v=40.0 / 64)
    ref = torch.zeros(2, 8, 4, 2, 16)
    write_kv_torch(ref, k, v, torch.arange(24))
    tables = torch.arange(8, dtype=torch.int32).view(2, 4)
    lens = torch.tensor([13, 11], dtype=torch.int32)
    q = torch.randn(2, 4, 16, generator=g)
    want = decode_attention_torch(q, ref, tables, lens, 13, 0.25)
    qp = torch.randn(5, 4, 16, generator=g)
    want_pre = prefill_attention_torch(qp, ref, tables[0], 8, 13, 0.25)
    errs = {}
    for name, sc in (("head", per_head), ("layer", per_layer)):
        fp8 = torch.zeros(2, 8, 4, 2, 16, dtype=torch.float8_e4m3fn)
        write_kv_torch(fp8, k, v, torch.arange(24), sc)
        got = decode_attention_torch(q, fp8, tables, lens, 13, 0.25, sc)
        pre = prefill_attention_torch(qp, fp8, tables[0], 8, 13, 0.25, sc)
        small = (got - want)[:, 2:].abs().max() / want[:, 2:].abs().max()  # heads on KV head 1
        small_pre = (pre - want_pre)[:, 2:].abs().max() / want_pre[:, 2:].abs().max()
        errs[name] = (small.item(), small_pre.item())
    assert max(errs["head"]) < 0.08, errs
    assert min(errs["layer"]) > 4 * max(errs["head"]), errs


def test_checkpoint_kv_scales_reach_the_attention_layers(tmp_path: Path) -> None:
    """`self_attn.k_scale` / `v_scale` in the checkpoint (per head or one value) become the
    layers' KV scales on the cache's device; a malformed scale is refused by name."""
    from safetensors.torch import load_file, save_file

    from loraplex.platform.engine.models.weight_loading import WeightLoadingError

    save_tiny_model(tmp_path, "llama", seed=5, with_tokenizer=False)
    (weights,) = tmp_path.glob("*.safetensors")
    tensors = load_file(str(weights))
    layers = sorted({int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.")})
    heads = LLM(
        str(tmp_path), max_loras=0, num_gpu_blocks=16, block_size=4, max_model_len=64
    ).core.model.model.layers[0]
    hkv = heads.self_attn.attn.num_kv_heads
    for i in layers:
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.arange(1, hkv + 1) * 0.01 * (i + 1)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.02 * (i + 1))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    llm = LLM(
        str(tmp_path),
        kv_cache_dtype="fp8",
        max_loras=0,
        num_gpu_blocks=16,
        block_size=4,
        max_model_len=64,
    )
    for i, layer in enumerate(llm.core.model.model.layers):
        sc = layer.self_attn.attn.kv_scales
        assert torch.allclose(sc.k, torch.arange(1, hkv + 1) * 0.01 * (i + 1))
        assert torch.allclose(sc.v, torch.full((hkv,), 0.02 * (i + 1)))
    out = llm.generate(_prompts(2), GREEDY)
    assert all(len(o.outputs[0].token_ids) == 12 for o in out)
    tensors["model.layers.0.self_attn.k_scale"] = torch.ones(hkv + 1)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(WeightLoadingError, match="k_scale"):
        LLM(
            str(tmp_path),
            kv_cache_dtype="fp8",
            max_loras=0,
            num_gpu_blocks=16,
            block_size=4,
            max_model_len=64,
        )
