"""Draft-model figures of `loraplex bench spec`, on trained tiny models (random weights make
acceptance meaningless): the byte-level stdlib Llama of `bench quant` as the target, a smaller
draft trained on the same corpus, and six LoRAs of the target, each with a draft adapter trained
on the same data for the draft model.

Three adapters shift the output heavily (their text is upper-cased, ROT13'd, or has every
letter doubled) and three mildly (plain code of one standard-library package each). Per
adapter, greedy decoding of held-out windows in that adapter's style, the mean acceptance length
with the plain draft (`method="draft_model"`) and with its draft adapter tied
(`method="draft_adapter"`), K = 4 fixed.

- spec.heavy_shift_al_gain: mean over the heavy adapters of AL(draft adapter) / AL(plain
  draft); target at least 1.3. spec.mild_al_gain: the same over the mild ones.
- spec.draft_model_b1_speedup / spec.draft_adapter_b1_speedup: decode throughput at batch 1
  over no speculation (lockstep), the base model with the draft model and a heavy adapter with
  its draft adapter, the controller and guard choosing K as in serving.
"""

from __future__ import annotations

import codecs
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from loraplex.bench._stdlib_llama import CONFIG, corpus, encode, stdlib_files

DRAFT_CONFIG: dict[str, Any] = {**CONFIG, "hidden_size": 64, "intermediate_size": 192,
                                "num_hidden_layers": 1, "num_attention_heads": 1,
                                "num_key_value_heads": 1}  # fmt: skip


def _rot13(b: bytes) -> bytes:
    return codecs.encode(b.decode("latin-1"), "rot13").encode("latin-1")


def _double(b: bytes) -> bytes:
    return bytes(c for ch in b for c in ((ch, ch) if chr(ch).isalpha() else (ch,)))


HEAVY: dict[str, Callable[[bytes], bytes]] = {
    "upper": bytes.upper,
    "rot13": _rot13,
    "double": _double,
}
MILD = {"mild_email": "email", "mild_asyncio": "asyncio", "mild_unittest": "unittest"}


def style_text(name: str, limit: int) -> bytes:
    """Up to `limit` bytes of the training text of adapter `name` (files separated by 255)."""
    train, _ = stdlib_files()
    if name in MILD:
        train = [p for p in train if MILD[name] in p.parts]
    buf = bytearray()
    for p in train:
        try:
            text = p.read_bytes()
        except OSError:
            continue
        buf += (HEAVY[name](text) if name in HEAVY else text) + bytes([255])
        if len(buf) >= limit:
            break
    return bytes(buf[:limit])


def style_prompts(name: str | None, count: int, length: int) -> list[list[int]]:
    """`count` held-out windows of `length` tokens in adapter `name`'s style (None: plain)."""
    _, held = stdlib_files()
    if name in MILD:
        held = [p for p in held if MILD[name] in p.parts] or held
    held = sorted(held, key=lambda p: p.stat().st_size, reverse=True)
    out: list[list[int]] = []
    for p in held:
        text = p.read_bytes()
        if name in HEAVY:
            text = HEAVY[name](text)
        if len(text) >= 2 * length:
            mid = len(text) // 3
            out.append([1, *encode(text[mid : mid + length - 1])])
        if len(out) == count:
            break
    return out


def _train(
    model: Any, data: torch.Tensor, steps: int, lr: float, log: Callable[[str], None]
) -> float:  # noqa: ANN401
    """Next-token training on random windows of `data`; the final loss (EMA, nats/byte)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    batch, seq = 8, 128
    g = torch.Generator().manual_seed(1)
    loss_ema = math.nan
    start = time.monotonic()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = (
                lr
                * min(1.0, (step + 1) / 20)
                * (0.1 + 0.9 * math.cos(0.5 * math.pi * step / steps))
            )
        idx = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[i : i + seq] for i in idx.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * loss.item()
        if (step + 1) % 100 == 0:
            log(f"  step {step + 1}/{steps} loss {loss_ema:.3f} ({time.monotonic() - start:.0f} s)")
    return loss_ema


def trained_draft(cache_dir: Path, steps: int, log: Callable[[str], None]) -> Path:
    """The cached small draft model (same byte vocabulary as the target), trained if needed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = cache_dir / f"stdlib-draft-h{DRAFT_CONFIG['hidden_size']}-n{steps}"
    if (path / "train.json").exists():
        return path
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**DRAFT_CONFIG)).float().train()
    data = corpus(stdlib_files()[0], limit=8_000_000)
    log(f"training the draft for {steps} steps")
    loss = _train(model, data, steps, 3e-3, log)
    path.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(path))
    (path / "train.json").write_text(json.dumps({"steps": steps, "loss": loss}))
    return path


def trained_lora(
    base: Path, name: str, steps: int, cache_dir: Path, log: Callable[[str], None]
) -> Path:
    """The cached LoRA of adapter `name` (rank 8, every projection) over `base`."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    path = cache_dir / f"lora-{base.name}-{name}-n{steps}"
    if (path / "train.json").exists():
        return path
    torch.manual_seed(0)
    model = get_peft_model(
        LlamaForCausalLM.from_pretrained(str(base)).float(),
        LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    )
    model.train()
    data = torch.frombuffer(bytearray(style_text(name, 2_000_000)), dtype=torch.uint8).long() + 3
    log(f"training adapter {name} over {base.name} for {steps} steps")
    loss = _train(model, data, steps, 5e-3, log)
    model.save_pretrained(str(path))
    (path / "train.json").write_text(json.dumps({"steps": steps, "loss": loss}))
    return path


def _llm(target: Path, max_loras: int) -> Any:  # noqa: ANN401
    from loraplex.platform.engine import LLM

    return LLM(str(target), max_loras=max(1, max_loras), max_lora_rank=8, cpu_threads=1,
               max_model_len=1024, max_num_seqs=16, max_num_batched_tokens=2048)  # fmt: skip


def acceptance_lengths(
    target: Path,
    draft: Path,
    adapters: dict[str, tuple[Path, Path]],
    prompts: dict[str, list[list[int]]],
    tokens: int,
) -> dict[str, tuple[float, float]]:
    """Per adapter, the mean acceptance length with the plain draft and with its draft adapter
    (greedy, K = 4 every step)."""
    from loraplex.platform.engine import SamplingParams
    from loraplex.platform.engine.speculative import SpecConfig

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    work = [p for name in adapters for p in prompts[name]]
    refs = [str(adapters[name][0]) for name in adapters for _ in prompts[name]]
    got: dict[str, dict[str, float]] = {}
    for method in ("draft_model", "draft_adapter"):
        llm = _llm(target, len(adapters))
        core = llm.core
        spec = SpecConfig(method=method, draft_model=str(draft), k_max=4, adaptive=False)
        core.enable_speculation(spec)
        keys = {n: core.lora_runtime.resolve_adapter(str(a))[0] for n, (a, _) in adapters.items()}
        if method == "draft_adapter":
            for name, (_, tied) in adapters.items():
                core.speculator.register_draft_adapter(keys[name], str(tied))
        llm.generate(work, params, adapters=refs)
        stats = core.speculator.stats
        got[method] = {n: stats[keys[n]].mean_acceptance_length for n in adapters}
    return {n: (got["draft_model"][n], got["draft_adapter"][n]) for n in adapters}


def b1_speedup(
    target: Path,
    draft: Path,
    prompts: list[list[int]],
    tokens: int,
    adapter: tuple[Path, Path] | None = None,
) -> float:
    """Decode throughput at batch 1 with the draft model (and the adapter's draft adapter
    tied, when given) over no speculation, in lockstep, K chosen by the controller."""
    from loraplex.bench.lockstep import lockstep_times
    from loraplex.platform.engine import SamplingParams
    from loraplex.platform.engine.speculative import SpecConfig

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    engines = {"off": _llm(target, 1).core, "on": _llm(target, 1).core}
    on = engines["on"]
    method = "draft_model" if adapter is None else "draft_adapter"
    on.enable_speculation(SpecConfig(method=method, draft_model=str(draft), k_max=4))
    ref = None if adapter is None else str(adapter[0])
    if adapter is not None:
        on.speculator.register_draft_adapter(
            on.lora_runtime.resolve_adapter(ref)[0], str(adapter[1])
        )
    refs = {k: [ref] * len(prompts) for k in engines}
    spent = lockstep_times(engines, prompts, refs, params, tokens * len(prompts))
    return spent["off"] / spent["on"]


def main_results(args: Any, log: Callable[[str], None]) -> None:  # noqa: ANN401
    """Train (or reuse) the models and adapters, then print the draft-model RESULT lines."""
    from loraplex.bench._stdlib_llama import trained_model

    cache: Path = args.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    target = trained_model(cache, args.train_steps, log=log)
    draft = trained_draft(cache, args.draft_steps, log)
    names = [*HEAVY, *MILD]
    adapters = {
        n: (trained_lora(target, n, args.lora_steps, cache, log),
            trained_lora(draft, n, args.lora_steps, cache, log))
        for n in names
    }  # fmt: skip
    prompts = {n: style_prompts(n, args.al_prompts, args.al_prompt_tokens) for n in names}
    lengths = acceptance_lengths(target, draft, adapters, prompts, args.al_tokens)
    for n, (plain, tied) in lengths.items():
        print(f"RESULT spec.al_plain_draft.{n}={plain:.4f}")
        print(f"RESULT spec.al_draft_adapter.{n}={tied:.4f}")
    for group, members in (("heavy_shift", HEAVY), ("mild", MILD)):
        gains = [lengths[n][1] / lengths[n][0] for n in members if lengths[n][0] > 0]
        print(f"RESULT spec.{group}_al_gain={sum(gains) / max(1, len(gains)):.4f}")
    base_prompts = style_prompts(None, args.b1_prompts, args.al_prompt_tokens)
    print(
        f"RESULT spec.draft_model_b1_speedup={b1_speedup(target, draft, base_prompts, args.tokens):.4f}"
    )
    heavy = next(iter(HEAVY))
    ratio = b1_speedup(
        target, draft, prompts[heavy][: args.b1_prompts], args.tokens, adapters[heavy]
    )
    print(f"RESULT spec.draft_adapter_b1_speedup={ratio:.4f}")
