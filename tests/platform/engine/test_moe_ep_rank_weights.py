"""Each expert-parallel rank reads only its experts' weights (issue #6): from a local folder
(other ranks' tensors skipped unread) and from the real S3 server (ranged GETs cover only the
rank's bytes, fused 3-D expert tensors read by rows), and the 2-rank engine's greedy output
still equals a single-process engine's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file
from support.moe_ep_workers import NUM_EXPERTS, save_tiny_qwen2_moe

from loraplex.loader.select import expert_index, layer_index

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORLD = 2
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]


@pytest.fixture(scope="module")
def per_expert_dir(tmp_path_factory) -> Path:
    return Path(save_tiny_qwen2_moe(tmp_path_factory.mktemp("qwen2moe_per_expert")))


@pytest.fixture(scope="module")
def fused_dir(per_expert_dir: Path, tmp_path_factory) -> Path:
    """The same weights with transformers' fused 3-D expert tensors."""
    out = tmp_path_factory.mktemp("qwen2moe_fused")
    hf = transformers.Qwen2MoeForCausalLM.from_pretrained(str(per_expert_dir))
    for f in per_expert_dir.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    save_file(state, str(out / "model.safetensors"))
    return out


def _config(model: str, storage=None):
    from loraplex.platform.engine_spec.config import EngineConfig

    return EngineConfig(
        model=model,
        storage=storage,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=64,
    )


def _generate(engine) -> list[list[int]]:
    from loraplex.platform.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
    return [list(r.output_token_ids) for r in reqs]


@pytest.fixture(scope="module")
def want(per_expert_dir: Path) -> list[list[int]]:
    from loraplex.platform.engine.engine_core import EngineCore

    return _generate(EngineCore(_config(str(per_expert_dir))))


def _expected_loads(folder: Path, rank: int) -> tuple[int, int, int]:
    """(tensors the rank needs, their bytes, bytes of the whole checkpoint) under the
    contiguous placement, computed from the file independently of the loader."""
    per = NUM_EXPERTS // WORLD
    held = range(rank * per, (rank + 1) * per)
    tensors = nbytes = total = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            t = f.get_tensor(name)
            size = t.numel() * t.element_size()
            total += size
            idx = expert_index(name)
            if idx is not None and idx not in held:
                continue
            assert layer_index(name) is not None or idx is None
            tensors += 1
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                size = size * per // NUM_EXPERTS  # only this rank's rows
            nbytes += size
    return tensors, nbytes, total


def _run_ep(config) -> tuple[list[list[int]], list[dict[str, int]]]:
    from loraplex.platform.engine.ep_engine import start_ep_engine

    engine = start_ep_engine(config, WORLD, backend="gloo")
    try:
        return _generate(engine), engine.rank_loads
    finally:
        engine.close()


def _check_loads(folder: Path, loads: list[dict[str, int]], s3: bool) -> None:
    assert len(loads) == WORLD
    for rank, got in enumerate(loads):
        tensors, nbytes, total = _expected_loads(folder, rank)
        assert nbytes < 0.75 * total  # experts dominate: a rank reads well under the whole
        assert got["weight_tensors"] == tensors, rank
        assert got["weight_bytes"] == nbytes, rank
        if s3:  # ranged GETs fetched exactly the rank's bytes, nothing more
            assert got["fetched_bytes"] == nbytes, rank


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_local_ep_ranks_read_only_their_experts(request, layout, want) -> None:
    folder = request.getfixturevalue(f"{layout}_dir")
    got, loads = _run_ep(_config(str(folder)))
    _check_loads(folder, loads, s3=False)
    assert got == want


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_s3_ep_ranks_fetch_only_their_experts(
    request, layout, want, s3_client, s3_bucket, s3_prefix, s3_endpoint
) -> None:
    from loraplex.platform.settings import Settings

    folder = request.getfixturevalue(f"{layout}_dir")
    for f in sorted(folder.iterdir()):
        s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + f.name, Body=f.read_bytes())
    settings = Settings(
        s3_endpoint_url=s3_endpoint, s3_bucket="not-the-model-bucket", loader_chunk_bytes=8192
    )
    got, loads = _run_ep(_config(f"s3://{s3_bucket}/{s3_prefix}", settings.storage()))
    _check_loads(folder, loads, s3=True)
    assert got == want
