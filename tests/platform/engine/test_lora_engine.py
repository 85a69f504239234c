"""Multi-LoRA through the whole engine vs peft: mixed adapters (ranks 4..64, target sets,
scalings incl. rsLoRA and rank/alpha patterns) plus base-only requests, through chunked
prefill, decode and prefix-cache hits; re-uploaded versions; background fetch from real S3."""

from __future__ import annotations

import copy
import hashlib
import os
import threading
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.lora import AdapterRef, LoraRuntime  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "r4_qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "r8_all": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    "r16_rslora_attn": dict(r=16, lora_alpha=16, use_rslora=True, target_modules=ALL[:4]),
    "r64_mlp": dict(r=64, lora_alpha=32, target_modules=ALL[4:]),
    "r32_patterns": dict(
        r=32,
        lora_alpha=64,
        target_modules=["q_proj", "o_proj", "down_proj", "up_proj"],
        rank_pattern={"q_proj": 8, "down_proj": 12},
        alpha_pattern={"o_proj": 3},
    ),
    "r12_regex": dict(
        r=12, lora_alpha=6, target_modules=r".*\.layers\.1\..*(k_proj|v_proj|gate_proj)"
    ),
    "r6_rslora_pattern": dict(
        r=6, lora_alpha=24, use_rslora=True, target_modules=ALL, rank_pattern={"up_proj": 40}
    ),
    "r20_layer0": dict(r=20, lora_alpha=10, target_modules=ALL, layers_to_transform=[0]),
    "r48_o_down": dict(r=48, lora_alpha=96, target_modules=["o_proj", "down_proj"]),
}
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base_dir = tmp_path_factory.mktemp("base")
    hf = save_tiny_model(base_dir, "llama", seed=3)
    hf.generation_config.eos_token_id = None
    dirs = {}
    for i, (name, kw) in enumerate(ADAPTERS.items()):
        dirs[name] = make_adapter(hf, tmp_path_factory.mktemp(name), seed=100 + i, **kw)
    return str(base_dir), hf, dirs


_PEFT_CACHE: dict = {}


def peft_logits(hf, adapter_dir, tokens: list[int]) -> torch.Tensor:
    """Logits [L, V] of the peft model (or the bare base for None) over `tokens` (memoised)."""
    key = (id(hf), str(adapter_dir), tuple(tokens), _digest(adapter_dir))
    if key not in _PEFT_CACHE:
        _PEFT_CACHE[key] = _peft_logits(hf, adapter_dir, tokens)
    return _PEFT_CACHE[key]


def _digest(adapter_dir) -> str | None:
    if adapter_dir is None:
        return None
    return hashlib.sha256(
        (Path(adapter_dir) / "adapter_model.safetensors").read_bytes()
    ).hexdigest()


def _peft_logits(hf, adapter_dir, tokens: list[int]) -> torch.Tensor:
    from peft import PeftModel

    model = copy.deepcopy(hf)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def check_against_peft(hf, prompts, refs, outs, rows, tol=1e-4):
    by_prompt = {}
    for rid, rs in rows.items():
        by_prompt[int(rid.split("-")[-2])] = torch.stack(rs)
    for i, (prompt, ref, out) in enumerate(zip(prompts, refs, outs, strict=True)):
        seq = prompt + out.outputs[0].token_ids
        want = peft_logits(hf, ref, seq[:-1])[len(prompt) - 1 :]
        got = by_prompt[i]
        assert got.shape == want.shape, (i, got.shape, want.shape)
        err = (got - want).abs().max().item()
        assert err < tol, f"prompt {i} ({ref}): max |logit diff| {err:.2e}"


def make_prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    lengths = [30, 7, 19, 1, 26, 11, 33, 5, 14, 22, 9, 28]
    return [
        torch.randint(3, 128, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)
    ]


# (engine args, what the run must show). "wide": every adapter in one step next to base
# tokens; "tight": 4 slots and ~150 rank rows, so adapters rotate and LRU eviction runs.
CONFIGS = {
    "wide": dict(max_loras=10, max_num_batched_tokens=48, max_num_seqs=16),
    "tight": dict(
        max_loras=4, adapter_memory=150 * 7424, max_num_batched_tokens=24, max_num_seqs=8
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_mixed_adapters_match_peft_through_chunks_decode_and_prefix_hits(world, config):
    base_dir, hf, dirs = world
    names = list(dirs)
    refs = [dirs[n] for n in names] + [None, None] + [dirs[names[1]], dirs[names[3]]]
    prompts = make_prompts(len(refs))
    # Every adapter really changes the logits, so equality with peft is not vacuous.
    for name in names:
        delta = (peft_logits(hf, dirs[name], prompts[0]) - peft_logits(hf, None, prompts[0])).abs()
        assert delta.max() > 1e-2, name
    llm = LLM(base_dir, max_lora_rank=64, block_size=4, **CONFIGS[config])
    rows = record_sampled_logits(llm)
    steps: list[tuple[int, int, int]] = []  # (adapters, base tokens, chunked prefills) per step
    rt = llm.core.lora_runtime
    prepare = rt.prepare_step

    def spy(requests, num_tokens):
        keys = {r.adapter_key for r in requests if r.adapter_key is not None}
        base = sum(n for r, n in zip(requests, num_tokens, strict=True) if r.adapter_key is None)
        chunks = sum(
            1
            for r, n in zip(requests, num_tokens, strict=True)
            if r.num_computed_tokens + n < r.num_prompt_tokens
        )
        steps.append((len(keys), base, chunks))
        return prepare(requests, num_tokens)

    rt.prepare_step = spy
    params = SamplingParams(max_tokens=8, **GREEDY)
    adapters = [str(r) if r else None for r in refs]
    outs = llm.generate(prompts, params, adapters=adapters)
    check_against_peft(hf, prompts, refs, outs, rows)
    assert any(c > 0 for _, _, c in steps)  # some prompts ran as several prefill chunks
    m = rt.metrics()
    assert m["adapter_memory_used_bytes"] <= m["adapter_memory_bytes"]
    if config == "wide":
        assert any(k >= 8 and b > 0 for k, b, _ in steps)  # >= 8 adapters + base in one step
    else:
        assert max(k for k, _, _ in steps) <= 4
        assert m["device_evictions"] > 0  # the pool is smaller than the adapters: LRU evicted
    text = llm.core.metrics.render().decode()
    for name in ("lora_adapter_resident", "lora_adapter_loads_total", "lora_requests_info"):
        assert f"loraplex:{name}" in text, name

    rows.clear()  # same batch again: prefix hits for every prompt with a full block
    again = llm.generate(prompts, params, adapters=adapters)
    assert all(o.num_cached_tokens > 0 for p, o in zip(prompts, again, strict=True) if len(p) > 8)
    check_against_peft(hf, prompts, refs, again, rows)
    for a, b in zip(outs, again, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_reuploaded_version_changes_output_and_never_reuses_old_kv(world, tmp_path):
    import shutil

    base_dir, hf, dirs = world
    path = make_adapter(hf, tmp_path / "tenant-adapter", seed=1, **ADAPTERS["r8_all"])
    old_copy = shutil.copytree(path, tmp_path / "v1-copy")
    llm = LLM(base_dir, max_loras=2, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    rows = record_sampled_logits(llm)
    prompt = make_prompts(1)[0]
    params = SamplingParams(max_tokens=3, **GREEDY)
    v1 = llm.generate([prompt], params, adapters=[str(path)])[0]
    check_against_peft(hf, [prompt], [old_copy], [v1], rows)
    v1_first = next(iter(rows.values()))[0]
    assert llm.generate([prompt], params, adapters=[str(path)])[0].num_cached_tokens > 0
    rows.clear()
    make_adapter(hf, path, seed=2, **ADAPTERS["r8_all"])  # same name, new weights
    v2 = llm.generate([prompt], params, adapters=[str(path)])[0]
    assert v2.num_cached_tokens == 0  # the old version's KV blocks are not reused
    check_against_peft(hf, [prompt], [path], [v2], rows)
    v2_first = next(iter(rows.values()))[0]
    assert (v2_first - v1_first).abs().max() > 1e-2  # the new version changes the output
    assert len(llm.core.lora_runtime.fetcher.sources) == 2  # two versions, two keys


class GatedStore:
    """A real ObjectStore whose reads wait for a gate: holds the fetch open on purpose."""

    def __init__(self, store):
        self.store = store
        self.gate = threading.Event()
        self.reads = 0

    def head(self, key):
        self.gate.wait(30)
        return self.store.head(key)

    def get_range(self, key, start, end):
        self.reads += 1
        return self.store.get_range(key, start, end)


def test_cold_adapter_fetched_from_s3_while_others_decode(
    world, s3_client, s3_bucket, s3_endpoint, s3_prefix
):
    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.settings import Settings

    base_dir, hf, dirs = world
    src = dirs["r16_rslora_attn"]
    weights = (src / "adapter_model.safetensors").read_bytes()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + name, Body=(src / name).read_bytes())
    store = GatedStore(
        ObjectStore(Settings(s3_endpoint_url=s3_endpoint, s3_bucket=s3_bucket).storage())
    )
    llm = LLM(base_dir, max_loras=2, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    core = llm.core
    core.lora_runtime.fetcher.object_store = store
    rows = record_sampled_logits(llm)
    prompts = make_prompts(3)
    params = SamplingParams(max_tokens=6, **GREEDY)
    sha = hashlib.sha256(weights).hexdigest()
    ref = AdapterRef(
        object_prefix=s3_prefix, sha256=sha, tenant="t1", targets=_targets_json(src, core)
    )
    cold = core.add_request(prompts[0], params, "llm-x-0-0-0", adapter=ref)
    core.add_request(prompts[1], params, "llm-x-0-1-0", adapter=str(dirs["r4_qv"]))
    core.add_request(prompts[2], params, "llm-x-0-2-0")
    for _ in range(3):
        core.step()
    assert cold in core.scheduler.waiting and cold.num_output_tokens == 0
    others = [r for r in core.scheduler.running]
    assert len(others) == 2 and all(r.num_output_tokens >= 2 for r in others)
    store.gate.set()
    while core.has_unfinished():
        core.step()
    assert cold.num_output_tokens == 6 and store.reads == 2
    got = torch.stack(rows["llm-x-0-0-0"])
    seq = prompts[0] + cold.output_token_ids
    want = peft_logits(hf, src, seq[:-1])[len(prompts[0]) - 1 :]
    assert (got - want).abs().max().item() < 1e-4
    assert core.lora_runtime.metrics()["adapters"][ref.key]["fetch_seconds"] is not None


def _targets_json(adapter_dir, core) -> dict:
    """What the validation job stores for this adapter: its targets resolved on RE2."""
    from loraplex.adapters.targets import resolve_config_targets

    config = (Path(adapter_dir) / "adapter_config.json").read_bytes()
    return resolve_config_targets(config, core.model.hf_config).to_json()


def test_replica_loading_an_adapter_never_runs_its_patterns(
    world, s3_client, s3_bucket, s3_endpoint, s3_prefix, monkeypatch
):
    """A target pattern that would freeze Python's re for minutes is served from its resolved
    targets: same logits as the adapter under a plain list config, and `re` never sees it."""
    import json
    import re
    import time

    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.settings import Settings

    base_dir, hf, dirs = world
    src = dirs["r20_layer0"]
    weights = (src / "adapter_model.safetensors").read_bytes()
    config = json.loads((src / "adapter_config.json").read_text())
    # Same weights (layer 0 only); the hostile pattern targets exactly layer 0's projections.
    config["target_modules"] = r"model\.layers\.0\..*_proj|(.+)+X"
    config["layers_to_transform"] = None
    config_bytes = json.dumps(config).encode()
    s3_client.put_object(Bucket=s3_bucket, Key=s3_prefix + "adapter_config.json", Body=config_bytes)
    s3_client.put_object(
        Bucket=s3_bucket, Key=s3_prefix + "adapter_model.safetensors", Body=weights
    )
    llm = LLM(base_dir, max_loras=2, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    core = llm.core
    from loraplex.adapters.targets import resolve_config_targets

    targets = resolve_config_targets(config_bytes, core.model.hf_config)
    assert targets.modules.keys() == {(0, m) for m in ALL}
    core.lora_runtime.fetcher.object_store = ObjectStore(
        Settings(s3_endpoint_url=s3_endpoint, s3_bucket=s3_bucket).storage()
    )
    seen: list[str] = []
    real_compile = re._compile

    def spy(pattern, flags):
        seen.append(str(pattern))
        return real_compile(pattern, flags)

    monkeypatch.setattr(re, "_compile", spy)
    ref = AdapterRef(
        object_prefix=s3_prefix,
        sha256=hashlib.sha256(weights).hexdigest(),
        tenant="t1",
        targets=targets.to_json(),
    )
    params = SamplingParams(max_tokens=4, **GREEDY)
    prompt = make_prompts(1)[0]
    began = time.monotonic()
    hostile = llm.generate([prompt], params, adapters=[ref])[0].outputs[0].token_ids
    assert time.monotonic() - began < 60
    monkeypatch.undo()
    assert not [p for p in seen if "proj" in p or "(.+)+" in p], seen
    plain = llm.generate([prompt], params, adapters=[str(src)])[0].outputs[0].token_ids
    base = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert hostile == plain and plain != base


def test_bad_adapter_directory_fails_fast(world, tmp_path):
    base_dir, hf, dirs = world
    llm = LLM(base_dir, max_loras=2, block_size=4)
    with pytest.raises(ValueError, match="adapter_config.json"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=1), adapters=[str(tmp_path)])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(
        '{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": true}'
    )
    (bad / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not supported yet"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=1), adapters=[str(bad)])
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, **GREEDY))  # engine still fine
    assert len(out[0].outputs[0].token_ids) == 2


def test_replica_refs_only_and_checked(world):
    base_dir, hf, dirs = world
    llm = LLM(base_dir, max_loras=2, block_size=4)
    rt = LoraRuntime(llm.core.model, max_loras=2, max_lora_rank=64, allow_local_paths=False)
    with pytest.raises(ValueError, match="object storage only"):
        rt.resolve_adapter(str(dirs["r4_qv"]))
    targets = _targets_json(dirs["r4_qv"], llm.core)
    with pytest.raises(ValueError, match="no object store"):
        rt.resolve_adapter({"object_prefix": "t/a/v1/", "sha256": "a" * 64, "targets": targets})
    rt.fetcher.object_store = object()  # only its presence is checked before a fetch
    key, handle = rt.resolve_adapter(
        {"object_prefix": "t/a/v1/", "sha256": "A" * 64, "tenant": "t", "targets": targets}
    )
    assert key == "a" * 64 and handle.tenant == "t"
    for bad in (
        {"object_prefix": "t/a/v1/", "sha256": "a" * 64},  # no resolved targets
        {"object_prefix": "t/a/v1/", "sha256": "a" * 64, "targets": {"format": 1, "groups": []}},
        {"object_prefix": "t/a/v1/", "sha256": "xyz"},
        {"object_prefix": "t/../v1/", "sha256": "a" * 64},
        {"object_prefix": "t/a/v1/", "sha256": "a" * 64, "extra": 1},
    ):
        with pytest.raises(ValueError):
            rt.resolve_adapter(bad)
    rt.detach()


def test_moe_model_attention_adapters_match_peft(tmp_path):
    """On a MoE base (Qwen3-MoE: q/k norm, head_dim != hidden/heads) adapters target the
    attention projections, or the router (its LoRA adds to the routing logits)."""
    from loraplex.bench._synthetic.models import hf_config, random_model

    cfg = hf_config(
        "qwen3_moe", intermediate_size=80, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True,
    )  # fmt: skip
    hf = random_model(cfg, seed=2).eval()
    base = tmp_path / "moe"
    hf.save_pretrained(str(base))
    attn = make_adapter(hf, tmp_path / "attn", seed=4, r=8, lora_alpha=16, target_modules=ALL[:4])
    router = make_adapter(
        hf, tmp_path / "router", seed=5, r=4, lora_alpha=8, target_modules=["gate"]
    )
    llm = LLM(str(base), max_loras=2, block_size=4, max_num_batched_tokens=32, max_num_seqs=8)
    rows = record_sampled_logits(llm)
    prompts = make_prompts(3)
    refs = [attn, None, attn]
    outs = llm.generate(
        prompts,
        SamplingParams(max_tokens=3, **GREEDY),
        adapters=[str(r) if r else None for r in refs],
    )
    check_against_peft(hf, prompts, refs, outs, rows)
    rows.clear()  # an adapter on the router (`gate`) is served too (issue 26), as peft runs it
    prompts = make_prompts(2)
    outs = llm.generate(
        prompts, SamplingParams(max_tokens=3, **GREEDY), adapters=[str(router), None]
    )
    check_against_peft(hf, prompts, [router, None], outs, rows)


def test_identical_bytes_of_two_tenants_survive_the_first_tenants_delete(
    world, s3_client, s3_bucket, s3_endpoint, s3_prefix
):
    """Two tenants upload the same adapter bytes (one version key, two object copies). The
    first deletes its copy; once the version is evicted from host and device, the second
    tenant's requests fetch from its own copy and match peft."""
    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.settings import Settings

    base_dir, hf, dirs = world
    src = dirs["r4_qv"]
    files = {
        n: (src / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")
    }
    prefix_a, prefix_b = s3_prefix + "tenant-a/", s3_prefix + "tenant-b/"
    for prefix in (prefix_a, prefix_b):
        for name, body in files.items():
            s3_client.put_object(Bucket=s3_bucket, Key=prefix + name, Body=body)
    llm = LLM(base_dir, max_loras=2, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    core = llm.core
    core.lora_runtime.fetcher.object_store = ObjectStore(
        Settings(s3_endpoint_url=s3_endpoint, s3_bucket=s3_bucket).storage()
    )
    sha = hashlib.sha256(files["adapter_model.safetensors"]).hexdigest()
    targets = _targets_json(src, core)
    ref_a = AdapterRef(object_prefix=prefix_a, sha256=sha, tenant="tenant-a", targets=targets)
    ref_b = AdapterRef(object_prefix=prefix_b, sha256=sha, tenant="tenant-b", targets=targets)
    assert ref_a.key == ref_b.key
    rows = record_sampled_logits(llm)
    prompt = make_prompts(1)[0]
    params = SamplingParams(max_tokens=4, **GREEDY)
    first = llm.generate([prompt], params, adapters=[ref_a])[0]
    llm.generate([prompt], params, adapters=[ref_b])  # same key: served from memory
    llm.generate([prompt], params, adapters=[ref_a])  # tenant a's copy requested last
    for name in files:
        s3_client.delete_object(Bucket=s3_bucket, Key=prefix_a + name)
    runtime = core.lora_runtime
    runtime.tiers.allocated_pool.evict(ref_a.key)
    assert runtime.host.discard(ref_a.key)
    rows.clear()
    params_b = SamplingParams(max_tokens=4, **GREEDY)
    again = llm.generate([prompt + [7]], params_b, adapters=[ref_b])[0]  # a new prompt: no KV reuse
    assert again.finish_reason == "length" and len(again.outputs[0].token_ids) == 4
    check_against_peft(hf, [prompt + [7]], [src], [again], rows)
    assert first.outputs[0].token_ids  # the first tenant's requests ran too
    assert runtime.metrics()["adapters"][ref_b.key]["on_host"]
