"""The deterministic mode (issue 23): a needle request's sampled logits are bitwise identical
whatever surrounds it: batch size and its row in the batch, other requests' adapters and
`max_loras`, chunked-prefill boundaries and chunk size, prefix cache cold or warm, preemption
with recompute, its adapter fetched just now or resident, a fresh engine; greedy and seeded
sampling alike. Configurations the mode does not cover are refused, naming what is missing.

CI runs a reduced matrix; `LORAPLEX_DETERMINISM_FULL=1` runs every batch size 1..64, every
chunk size 1..16 and more neighbours.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.logit_spy import record_sampled_logits  # noqa: E402
from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine import LLM, SamplingParams  # noqa: E402
from loraplex.platform.engine.batch_invariant import (  # noqa: E402
    DeterministicModeUnsupported,
    make_batch_invariant,
)
from loraplex.platform.engine.layers.fixed_order_cpu import fixed_order_available  # noqa: E402
from loraplex.platform.engine_spec.config import EngineConfig  # noqa: E402

FULL = os.environ.get("LORAPLEX_DETERMINISM_FULL") == "1"
NEEDLE = [11, 5, 9, 23, 7, 81, 4, 66, 12, 30, 2, 17, 44, 8, 91, 3, 27]
NEEDLE_TOKENS = 6

pytestmark = pytest.mark.skipif(not fixed_order_available(), reason="no C compiler here")


# The needle's models: the dense Llama (fp32, bf16), a Qwen3-MoE (its router and grouped
# experts; adapters on attention), and a Llama wide enough for int4's groups of 128 whose
# weights are quantized on load (int8, int4, fp8).
MODELS = {
    "dense": ("llama", {}, "all-linear"),
    "moe": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                              norm_topk_prob=True), ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "quant": ("llama", dict(hidden_size=128, intermediate_size=256, head_dim=32), "all-linear"),
}  # fmt: skip
QUANTIZATION = {"int8": "int8", "int4": "int4", "fp8": "fp8"}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    """`worlds(kind)`: a tiny model of MODELS[kind] and four adapters over it (33 with the
    full flag: the needle's and 32 distinct neighbours), built once per module."""
    made: dict[str, tuple[str, list[Path]]] = {}

    def build(kind: str) -> tuple[str, list[Path]]:
        if kind not in made:
            arch, fields, targets = MODELS[kind]
            base = tmp_path_factory.mktemp(f"base-{kind}")
            # a vocabulary past one vector pass
            hf = save_tiny_model(base, arch, seed=9, vocab_size=1000, **fields)
            adapters = [
                make_adapter(hf, tmp_path_factory.mktemp(f"ad-{kind}{i}"), seed=20 + i,
                             r=4 + 4 * (i % 2), lora_alpha=16, target_modules=targets)
                for i in range(33 if FULL else 4)
            ]  # fmt: skip
            made[kind] = (str(base), adapters)
        return made[kind]

    return build


@pytest.fixture(scope="module")
def world(worlds) -> tuple[str, list[Path]]:
    """The dense Llama and its adapters."""
    return worlds("dense")


def _llm(base: str, dtype: str, **kw: object) -> LLM:
    args: dict[str, object] = dict(
        dtype=dtype, deterministic=True, block_size=4, max_loras=8, max_lora_rank=16,
        max_num_batched_tokens=64, max_num_seqs=64,
    )  # fmt: skip
    args.update(kw)
    return LLM(base, **args)


def _hay(i: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(3, 120, (3 + (i * 7) % 23,), generator=g).tolist()


def _needle_params(seeded: bool, plp: bool = True) -> SamplingParams:
    """Greedy or seeded, with logprobs, and prompt logprobs unless `plp` is False (a request
    that wants them skips the prefix cache)."""
    extra = dict(temperature=0.9, seed=42) if seeded else dict(temperature=0.0)
    return SamplingParams(max_tokens=NEEDLE_TOKENS, logprobs=3, ignore_eos=True,
                          prompt_logprobs=2 if plp else None, **extra)  # fmt: skip


def _run(
    llm: LLM,
    needle_adapter: object,
    *,
    seeded: bool,
    before: int = 0,
    after: int = 0,
    hay_adapters: list[object | None] | None = None,
    late: int = 0,
    plp: bool = True,
) -> tuple[list[int], list[torch.Tensor], object]:
    """The needle among `before` + `after` haystack requests (added before and after it; the
    first `late` of them join once the others are decoding), stepped to the end: the needle's
    tokens, its sampled logits rows as bits, and the request."""
    core = llm.core
    rows = record_sampled_logits(llm)
    hay_params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    adapters = hay_adapters or [None]
    hay = [(f"h{i}", _hay(i), adapters[i % len(adapters)]) for i in range(before + after)]
    queued = hay[:late]
    for rid, prompt, ad in hay[late : late + before]:
        core.add_request(prompt, hay_params, rid, adapter=ad)
    params = _needle_params(seeded, plp)
    needle = core.add_request(NEEDLE, params, "needle", adapter=needle_adapter)
    for rid, prompt, ad in hay[late + before :]:
        core.add_request(prompt, hay_params, rid, adapter=ad)
    steps = 0
    while core.has_unfinished():
        core.step()
        steps += 1
        if steps == 2:
            for rid, prompt, ad in queued:
                core.add_request(prompt, hay_params, rid, adapter=ad)
    bits = [r.view(torch.int32) for r in rows["needle"]]
    return list(needle.output_token_ids), bits, needle


def _logprobs(needle: object) -> list:
    """The needle's sampled and prompt logprobs as exact float bit patterns."""
    import struct

    def bits(entries: list) -> list:
        return [None if e is None else sorted((k, struct.pack("<d", v)) for k, v in e.items())
                for e in entries]  # fmt: skip

    return [bits(needle.logprobs), bits(needle.prompt_logprobs)]


def _same(got: tuple, want: tuple, what: str) -> None:
    tokens, bits, needle = got
    assert tokens == want[0], f"{what}: tokens {tokens} != {want[0]}"
    sampled, prompt = _logprobs(needle)
    want_sampled, want_prompt = _logprobs(want[2])
    assert sampled == want_sampled, f"{what}: sampled logprobs differ"
    assert prompt == want_prompt, f"{what}: prompt logprobs differ"
    assert len(bits) == len(want[1]) == NEEDLE_TOKENS, what
    for i, (g, w) in enumerate(zip(bits, want[1], strict=True)):
        differing = int((g != w).sum())
        assert differing == 0, f"{what}: {differing} differing logits at token {i}"


# CI: fp32 greedy and bf16 seeded, both with an adapter; the full flag runs all eight. The MoE
# model in fp32 and bf16, and the quantized bases (bf16 compute), with an adapter.
MATRIX = [
    ("dense", dtype, seeded, with_adapter)
    for dtype in ("float32", "bfloat16")
    for seeded in (False, True)
    for with_adapter in (False, True)
    if FULL or (with_adapter and seeded == (dtype == "bfloat16"))
] + [
    ("moe", "float32", False, True),
    ("moe", "bfloat16", True, True),
    ("int8", "bfloat16", False, True),
    ("int4", "bfloat16", True, True),
    ("fp8", "bfloat16", False, True),
]


@pytest.mark.parametrize(("model", "dtype", "seeded", "with_adapter"), MATRIX)
def test_the_needle_never_moves_a_bit(
    worlds, model: str, dtype: str, seeded: bool, with_adapter: bool
) -> None:
    base, adapters = worlds("quant" if model in QUANTIZATION else model)
    quant = {"quantization": QUANTIZATION[model]} if model in QUANTIZATION else {}
    ad = str(adapters[0]) if with_adapter else None
    want = _run(_llm(base, dtype, **quant), ad, seeded=seeded)  # alone, cold, fetched now
    others = [str(a) for a in adapters[1:]]
    cases: list[tuple[str, dict, dict]] = []
    # batch sizes up to 64, the needle first, in the middle, last (CI: three of them)
    placements = [(n, b) for n in range(1, 64) for b in sorted({0, n // 2, n})]
    for n, before in placements if FULL else [(1, 0), (1, 1), (63, 40)]:
        cases.append((f"batch {n + 1} at row {before}", {}, dict(before=before, after=n - before)))
    cases += [
        ("neighbours share its adapter", {}, dict(before=3, after=2, hay_adapters=[ad])),
        ("neighbours: base and others", {}, dict(before=4, after=3, hay_adapters=[None, *others])),
        ("max_loras 4", dict(max_loras=4), dict(before=2, after=2, hay_adapters=others[:2])),
        ("late joiners while it decodes", {}, dict(before=1, after=0, late=6)),
        ("no prefix cache", dict(enable_prefix_caching=False), dict(before=2, after=1)),
        ("no chunked prefill", dict(enable_chunked_prefill=False, max_num_batched_tokens=128,
                                    max_model_len=128), dict(before=2, after=2)),
    ]  # fmt: skip
    if FULL:  # 32 distinct adapters beside it, every slot in use
        many = dict(before=16, after=16, hay_adapters=[str(a) for a in adapters[1:33]])
        cases.append(("32 distinct neighbour adapters", dict(max_loras=33), many))
    for chunk in range(1, 17) if FULL else (3, 16):  # every chunk boundary of its prompt
        cases.append((f"prefill chunks of {chunk}", dict(max_num_batched_tokens=chunk,
                      max_num_seqs=1), {}))  # fmt: skip
    cases.append(("chunk 7 behind a neighbour", dict(max_num_batched_tokens=7, max_num_seqs=2),
                  dict(before=1, after=1)))  # fmt: skip
    for what, engine_kw, run_kw in cases:
        _same(
            _run(_llm(base, dtype, **quant, **engine_kw), ad, seeded=seeded, **run_kw), want, what
        )

    assert len(want[2].prompt_logprobs) == len(NEEDLE)
    cold = _run(
        _llm(base, dtype, **quant), ad, seeded=seeded, plp=False
    )  # no prompt logprobs: cached
    warm = _llm(base, dtype, **quant)  # the same engine again: prefix cache warm, adapter resident
    _run(warm, ad, seeded=seeded, plp=False)
    again = _run(warm, ad, seeded=seeded, before=2, after=1, plp=False)
    assert again[2].num_cached_tokens > 0
    _same(again, cold, "prefix cache warm, adapter resident")
    _same(cold, (want[0], want[1], cold[2]), "with and without prompt logprobs")

    tight = _llm(base, dtype, **quant, num_gpu_blocks=14, max_model_len=32)  # preempted, recomputed
    got = _run(tight, ad, seeded=seeded, before=3, after=3)
    assert tight.core.scheduler.num_preemptions > 0
    _same(got, want, "preemption with recompute")


def test_a_fresh_process_gives_the_same_bits(world, tmp_path: Path) -> None:
    """A process restart: the needle in a new interpreter matches this one bit for bit."""
    import subprocess
    import sys

    base, adapters = world
    _, bits, _ = _run(_llm(base, "bfloat16"), str(adapters[0]), seeded=True, before=2, after=2)
    out = tmp_path / "bits.pt"
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_deterministic_mode import _llm, _run\n"
        f"_, bits, _ = _run(_llm({base!r}, 'bfloat16'), {str(adapters[0])!r}, seeded=True)\n"
        f"torch.save(bits, {str(out)!r})\n"
    )
    tests_dir = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": f"{tests_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
    theirs = torch.load(out)
    assert all(torch.equal(a, b) for a, b in zip(bits, theirs, strict=True))


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        (dict(quantization="awq"), "quantization awq"),
        (dict(quantization="gptq"), "quantization gptq"),
        (dict(kv_cache_dtype="fp8"), "kv_cache_dtype fp8"),
        (dict(device="cuda:0"), "device cuda:0"),
        (dict(ep_size=2), "expert parallelism"),
    ],
)
def test_uncovered_configurations_are_refused_naming_what(kw: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"deterministic mode does not cover {named}"):
        EngineConfig(model="m", deterministic=True, **kw)


@pytest.mark.parametrize("quantization", ["int8", "int4", "int4_sym", "fp8"])
def test_quantization_on_load_is_covered(quantization: str) -> None:
    assert EngineConfig(model="m", deterministic=True, quantization=quantization).deterministic


def test_fp16_compute_is_refused() -> None:
    """The model-dependent refusal: fp16 compute (fp32 and bf16 only)."""
    config = EngineConfig(model="m", deterministic=True)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(DeterministicModeUnsupported, match="does not cover compute dtype"):
        make_batch_invariant(model, config, {}, torch.float16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_moe_modes_logits_are_the_models(worlds, dtype: str) -> None:
    """The MoE model under the mode (needle among neighbours, prompt in chunks of 5) against
    transformers: fp32 within 1e-4; bf16 close to fp32 with the same greedy tokens."""
    from transformers import AutoModelForCausalLM

    base, _ = worlds("moe")
    llm = _llm(base, dtype, max_num_batched_tokens=5, max_num_seqs=3)
    tokens, bits, _ = _run(llm, None, seeded=False, before=1, after=1)
    got = torch.stack([b.view(torch.float32) for b in bits])
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    seq = NEEDLE + tokens
    with torch.no_grad():
        want = hf(torch.tensor([seq[:-1]])).logits[0, len(NEEDLE) - 1 :].float()
    assert got.shape == want.shape
    tol = 1e-4 if dtype == "float32" else 0.05 * want.abs().max().item()
    assert (got - want).abs().max().item() < tol


@pytest.mark.parametrize("quantization", ["int8", "int4", "fp8"])
def test_the_quantized_modes_logits_are_the_quantized_models(worlds, quantization: str) -> None:
    """Invariant and right: under the mode a quantized base's logits stay within bf16 rounding
    of the same quantized weights served without the mode (torch's quantized kernels)."""
    base, _ = worlds("quant")
    on = _run(_llm(base, "bfloat16", quantization=quantization), None, seeded=False)
    off_llm = LLM(base, dtype="bfloat16", quantization=quantization, block_size=4, max_loras=0)
    off = _run(off_llm, None, seeded=False)
    got = torch.stack([b.view(torch.float32) for b in on[1]])
    want = torch.stack([b.view(torch.float32) for b in off[1]])
    scale = want.abs().max().item()
    assert scale > 0.1
    assert (got - want).abs().max().item() < 0.03 * scale


def test_state_reports_the_mode(world) -> None:
    """`/state` (the replica's ReplicaState) says whether the replica runs the mode, and the
    option round-trips through the engine command line."""
    from loraplex.platform.engine_spec.cli import engine_args, parse_engine_args
    from loraplex.platform.wire import ReplicaState

    base, _ = world
    on, off = _llm(base, "float32", max_loras=0), LLM(base, dtype="float32", max_loras=0)
    assert on.core.state().deterministic is True and off.core.state().deterministic is False
    wire = ReplicaState.model_validate_json(on.core.state().model_dump_json())
    assert wire.deterministic is True
    argv = engine_args(on.core.config)
    assert "--deterministic" in argv
    assert parse_engine_args(argv)[0].deterministic is True
    assert not [a for a in engine_args(off.core.config) if "deterministic" in a]  # the default


@pytest.mark.parametrize("with_adapter", [False, True], ids=["base", "adapter"])
def test_the_modes_logits_are_the_models(world, with_adapter: bool) -> None:
    """Invariant and right: the needle's fp32 logits, its prompt in chunks of 5 beside
    neighbours, match transformers (peft with the adapter) to 1e-4."""
    import copy

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, adapters = world
    ad = str(adapters[0]) if with_adapter else None
    llm = _llm(base, "float32", max_num_batched_tokens=5, max_num_seqs=3)
    tokens, bits, _ = _run(llm, ad, seeded=False, before=1, after=1)
    got = torch.stack([b.view(torch.float32) for b in bits])
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(copy.deepcopy(hf), ad).eval() if ad else hf
    seq = NEEDLE + tokens
    with torch.no_grad():
        want = model(torch.tensor([seq[:-1]])).logits[0, len(NEEDLE) - 1 :].float()
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4


def test_expert_lora_is_refused_at_admission_naming_why(worlds, tmp_path: Path) -> None:
    """An adapter with LoRA on the MoE experts or router is refused when a request names it
    (a local directory, or an object-store reference whose resolved targets say so) and when
    the gateway warms it, never mid-forward: nothing is queued, and the engine goes on serving
    the base and attention-only adapters under the mode."""
    from support.expert_adapters import expert_adapter
    from transformers import AutoModelForCausalLM

    from loraplex.adapters.targets import resolve_config_targets
    from loraplex.platform.engine.lora import AdapterRef

    base, adapters = worlds("moe")
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    folder = expert_adapter(hf, tmp_path / "experts", seed=5)
    llm = _llm(base, "float32")
    core = llm.core
    config = (folder / "adapter_config.json").read_bytes()
    targets = resolve_config_targets(config, core.model.hf_config).to_json()
    ref = AdapterRef(object_prefix="t/a/v1/", sha256="ab" * 32, tenant="t", targets=targets)
    why = "deterministic mode does not cover adapters on MoE experts or the router"
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for adapter in (str(folder), ref, {"object_prefix": "t/a/v1/", "sha256": "ab" * 32,
                                       "targets": targets}):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            core.add_request(NEEDLE, params, "refused", adapter=adapter)
        assert not core.has_unfinished()
    with pytest.raises(ValueError, match=why):
        core.lora_runtime.warm(ref)
    outs = llm.generate([NEEDLE, NEEDLE], params, adapters=[None, str(adapters[0])])
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 2]
