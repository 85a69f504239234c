"""LLM end to end on tiny random models: exactness vs transformers, batching invariance,
seeds, preemption, prefix caching and isolation, stop conditions, logprobs."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.scheduler import AdmitAll  # noqa: E402

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7], list(range(3, 40)), [9] * 11, [10, 20, 30, 40, 50, 60, 70], [4]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, torch.nn.Module]]:
    out = {}
    for arch in ("llama", "qwen2", "qwen3"):
        path = tmp_path_factory.mktemp(arch)
        hf = save_tiny_model(path, arch, tie=arch == "qwen3", seed=7)
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0
        out[arch] = (str(path), hf)
    return out


def make_llm(path: str, **kw: object) -> LLM:
    args = dict(block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    args.update(kw)
    return LLM(path, **args)


def hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_batch_equals_transformers_generate(models: dict, arch: str) -> None:
    path, hf = models[arch]
    llm = make_llm(path)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, **GREEDY))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == hf_greedy(hf, prompt, 10)
        assert out.finish_reason == "length"


def test_logprobs_match_transformers_logits_with_prefix_hits(models: dict) -> None:
    path, hf = models["llama"]
    llm = make_llm(path)
    shared = list(range(3, 30))
    prompts = [shared + [40, 41], shared + [50], [7, 8, 9]]
    params = SamplingParams(max_tokens=6, logprobs=3, **GREEDY)
    llm.generate(prompts[:1], params)  # warm the prefix cache
    outs = llm.generate(prompts, params)
    assert outs[1].num_cached_tokens > 0
    for prompt, out in zip(prompts, outs, strict=True):
        seq = prompt + out.token_ids
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([seq])).logits[0].float(), -1)
        for j, lp in enumerate(out.logprobs):
            row = ref[len(prompt) - 1 + j]
            assert set(row.topk(3).indices.tolist()) <= set(lp)
            for tok, value in lp.items():
                assert value == pytest.approx(row[tok].item(), abs=1e-4)


def test_prompt_logprobs_match_transformers(models: dict) -> None:
    path, hf = models["qwen2"]
    llm = make_llm(path, max_num_batched_tokens=8)  # the prompt is chunked over steps
    prompt = list(range(3, 25))
    out = llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=2, **GREEDY))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for j in range(1, len(prompt)):
        entry = out.prompt_logprobs[j]
        assert prompt[j] in entry and len(entry) <= 3
        for tok, value in entry.items():
            assert value == pytest.approx(ref[j - 1, tok].item(), abs=1e-4)


def test_same_request_alone_and_in_busy_batch(models: dict) -> None:
    path, _ = models["llama"]
    target = list(range(20, 33))
    greedy = SamplingParams(max_tokens=12, **GREEDY)
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True)
    alone = make_llm(path).generate([target, target], [greedy, seeded])
    noise = [list(range(i, i + 5 + 3 * i)) for i in range(1, 7)]
    busy_params = [SamplingParams(max_tokens=5 + i, temperature=1.0) for i in range(6)]
    busy = make_llm(path).generate(
        noise[:3] + [target] + noise[3:] + [target],
        busy_params[:3] + [greedy] + busy_params[3:] + [seeded],
    )
    assert busy[3].token_ids == alone[0].token_ids
    assert busy[-1].token_ids == alone[1].token_ids


def test_seeded_sampling_reproducible_and_seed_sensitive(models: dict) -> None:
    path, _ = models["qwen3"]
    llm = make_llm(path)
    prompt = [3, 4, 5, 6]

    def run(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=16, temperature=1.5, seed=seed, ignore_eos=True)
        return llm.generate([prompt], params)[0].token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_preemption_and_resume_equal_unpreempted_run(models: dict) -> None:
    path, _ = models["llama"]
    prompts = [list(range(3 + i, 17 + i)) for i in range(6)]
    params = SamplingParams(max_tokens=20, **GREEDY)
    roomy = make_llm(path).generate(prompts, params)
    tight = make_llm(path, num_gpu_blocks=16, max_model_len=64, enable_prefix_caching=False)
    outs = tight.generate(prompts, params)
    assert tight.core.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    assert tight.core.pool.num_free_blocks == 16


def test_prefix_cache_hits_give_identical_outputs_and_count(models: dict) -> None:
    path, _ = models["qwen2"]
    shared = list(range(3, 40))
    prompts = [shared + [i] for i in range(50, 54)]
    params = SamplingParams(max_tokens=8, **GREEDY)
    ref = make_llm(path, enable_prefix_caching=False).generate(prompts, params)
    llm = make_llm(path)
    llm.generate(prompts[:1], params)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert all(o.num_cached_tokens >= 32 for o in outs)
    assert llm.core.kv.hits >= 4 * 32
    assert b"loraplex:prefix_cache_hits_total" in llm.core.metrics.render()


class BaseOnlyRuntime:
    """A LoRA-runtime stand-in with no weights (`ports.LoraRuntimeProtocol`): resolves a
    reference to its key, admits everything, adds no delta."""

    admission_policy = AdmitAll()
    resident_adapters: list[str] = []

    def resolve_adapter(self, ref: str) -> tuple[str, object]:
        return ref.ljust(64, "0"), None

    def prepare_step(self, requests: list, num_tokens: list[int]) -> None:
        return None

    def take_failed_request_ids(self) -> list[str]:
        return []

    def static_lora_meta(self, max_batch: int) -> None:
        raise AssertionError("no decode graphs on CPU")


def test_salt_and_adapter_key_never_share_blocks(models: dict) -> None:
    path, _ = models["llama"]
    llm = make_llm(path, max_loras=0)  # no multi-LoRA runtime until one is installed below
    prompt = list(range(3, 40))
    params = SamplingParams(max_tokens=2, **GREEDY)
    with pytest.raises(NotImplementedError, match="multi-LoRA runtime not available"):
        llm.generate([prompt], params, adapters=["a"])
    llm._install_lora_runtime(BaseOnlyRuntime())
    llm.generate([prompt], params, cache_salt="tenant-a")
    assert llm.generate([prompt], params, cache_salt="tenant-b")[0].num_cached_tokens == 0
    assert llm.generate([prompt], params)[0].num_cached_tokens == 0
    assert llm.generate([prompt], params, adapters=["a"])[0].num_cached_tokens == 0
    assert llm.generate([prompt], params, adapters=["b"])[0].num_cached_tokens == 0
    assert llm.generate([prompt], params, cache_salt="tenant-a")[0].num_cached_tokens > 0
    assert llm.generate([prompt], params, adapters=["a"])[0].num_cached_tokens > 0


def test_stop_strings_max_tokens_ignore_eos_and_n(models: dict) -> None:
    path, hf = models["llama"]
    llm = make_llm(path)
    tok = llm.get_tokenizer()
    prompt = "hello world, how are"
    free = llm.generate([prompt], SamplingParams(max_tokens=40, **GREEDY))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 40
    assert free.text == tok.decode(free.token_ids)
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = llm.generate([prompt], SamplingParams(max_tokens=40, stop=[stop], **GREEDY))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    kept = llm.generate(
        [prompt],
        SamplingParams(max_tokens=40, stop=[stop], include_stop_str_in_output=True, **GREEDY),
    )[0]
    assert kept.text == free.text[: free.text.index(stop) + len(stop)]
    first = free.token_ids[0]
    by_id = llm.generate(
        [prompt], SamplingParams(max_tokens=40, stop_token_ids=[first], temperature=0)
    )
    assert by_id[0].token_ids == [first] and by_id[0].finish_reason == "stop"
    eos_llm = make_llm(path)
    eos_llm.core.eos_token_ids = frozenset({free.token_ids[1]})
    r = eos_llm.generate([prompt], SamplingParams(max_tokens=40, temperature=0))[0]
    assert r.token_ids == free.token_ids[:2] and r.finish_reason == "stop"
    many = llm.generate([prompt], SamplingParams(n=3, max_tokens=5, temperature=1.0, seed=3))[0]
    assert len(many.outputs) == 3 and all(len(c.token_ids) == 5 for c in many.outputs)


def test_bad_requests_raise_clear_errors(models: dict, tmp_path) -> None:
    path, _ = models["llama"]
    llm = make_llm(path, max_model_len=64)
    with pytest.raises(ValueError, match="out of range"):
        llm.generate([[1, 2, 100000]])
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([list(range(3, 70))])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]])
    with pytest.raises(
        ValueError, match="s3://bucket/model needs the object store's StorageConfig"
    ):
        LLM("s3://bucket/model")  # no settings given: refused before any network call
    with pytest.raises(ValueError, match="not a local directory"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="block_size"):
        LLM(path, block_size=3)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLM(path, max_model_len=100_000)
    with pytest.raises(ValueError, match="chunked prefill off"):
        LLM(path, enable_chunked_prefill=False, max_num_batched_tokens=64)
    assert llm.core.pool.num_free_blocks == llm.core.pool.num_blocks
    assert not llm.core.has_unfinished()
