"""Exactness of speculative sampling: per setting (temperature 0.3 / 1 / 1.5, top-p, a
penalty, K = 1 / 3 / 5, with and without an adapter), 200,000 verifications on a tiny random
fp32 model with a 16-token vocabulary. The engine's own path (draft views, the Sampler, the
accepted-prefix rule) emits, at every draft depth, tokens distributed as the target's
distribution there, computed independently here from transformers (+ peft) logits: chi-square
p > 0.01 and total variation < 0.01 (at depth 0, 200,000 draws; deeper depths by chi-square)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.request import Request  # noqa: E402
from loraplex.platform.engine.sampler import Sampler  # noqa: E402
from loraplex.platform.engine.sampling_params import SamplingParams  # noqa: E402
from loraplex.platform.engine.speculative.verify import draft_views, num_accepted  # noqa: E402

V = 16
DRAWS = 200_000
PROMPT = [3, 9, 4, 12, 7, 3, 9]
OUTPUT = [4, 12, 5]  # tokens already generated (penalties count them)
# (temperature, top_p, presence_penalty, K, adapter)
SETTINGS = [
    (0.3, 1.0, 0.0, 1, False),
    (1.0, 1.0, 0.0, 3, True),
    (1.5, 1.0, 0.0, 5, False),
    (1.0, 0.8, 0.0, 5, True),
    (1.5, 0.9, 0.0, 1, True),
    (0.3, 1.0, 0.0, 3, True),
    (1.0, 1.0, 1.0, 3, False),
]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory):
    from peft import PeftModel

    path = tmp_path_factory.mktemp("tiny16")
    hf = save_tiny_model(path, "llama", seed=5, with_tokenizer=False, vocab_size=V).eval()
    adapter = make_adapter(hf, tmp_path_factory.mktemp("a"), seed=8, r=4, lora_alpha=16,
                           target_modules="all-linear")  # fmt: skip
    peft = PeftModel.from_pretrained(save_tiny_model(
        tmp_path_factory.mktemp("copy"), "llama", seed=5, with_tokenizer=False, vocab_size=V
    ), str(adapter)).eval()  # fmt: skip

    def logits(with_adapter: bool, tokens: list[int]) -> torch.Tensor:
        model = peft if with_adapter else hf
        with torch.no_grad():
            return model(torch.tensor([tokens])).logits[0].float()

    return logits


def reference_probs(logits: torch.Tensor, seen: list[int], temp: float, top_p: float, pres: float):
    """The target distribution of one row, computed here from scratch (not by the Sampler)."""
    x = logits.clone()
    if pres:
        x[sorted(set(seen))] -= pres
    p = torch.softmax(x / temp, dim=-1)
    order = p.argsort(descending=True)
    before = p[order].cumsum(0) - p[order]
    keep = torch.zeros(V, dtype=torch.bool)
    keep[order[before <= top_p]] = True
    p = torch.where(keep, p, 0.0)
    return p / p.sum()


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness-of-fit p-value (cells with zero expected must be empty)."""
    n = counts.sum()
    zero = probs == 0
    assert counts[zero].sum() == 0, "drew a token the target gives probability 0"
    exp = probs[~zero].double() * n
    stat = ((counts[~zero].double() - exp) ** 2 / exp).sum()
    dof = int((~zero).sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


@pytest.mark.parametrize("temp,top_p,pres,k,with_adapter", SETTINGS)
def test_speculative_samples_follow_the_target_at_every_depth(
    targets, temp, top_p, pres, k, with_adapter
):
    context = PROMPT + OUTPUT
    # Drafts: a plausible continuation (the target's argmax at each depth), so deep rows are
    # reached often enough to test them too.
    drafts: list[int] = []
    for _ in range(k):
        drafts.append(int(targets(with_adapter, context + drafts)[-1].argmax()))
    rows = targets(with_adapter, context + drafts)[len(context) - 1 :]  # [K+1, V]
    probs = [reference_probs(rows[j], OUTPUT + drafts[:j], temp, top_p, pres) for j in range(k + 1)]
    params = SamplingParams(temperature=temp, top_p=top_p, presence_penalty=pres)
    request = Request("r", PROMPT, params, output_token_ids=list(OUTPUT))
    views, _ = draft_views([request], [drafts])
    # The rows' distributions as the engine's Sampler processes them; its own draws are the
    # exponential race over exactly these (checked bit for bit on 64 repeats), so the 200,000
    # draws below race over them vectorised.
    dist = Sampler().distribution(rows, views)
    race = torch.Generator().manual_seed(17)
    reps = 64
    q = torch.empty(reps * (k + 1), V).exponential_(generator=race)
    engine_draws = Sampler(seed=17)(rows.repeat(reps, 1), views * reps).token_ids
    assert engine_draws == (dist.repeat(reps, 1) / q).argmax(-1).tolist()
    noise = torch.empty(DRAWS, k + 1, V).exponential_(generator=race)
    sampled = (dist.unsqueeze(0) / noise).argmax(-1)  # [DRAWS, K+1]
    d = torch.tensor(drafts).expand(DRAWS, k)
    accepted = num_accepted(d, sampled, torch.full((DRAWS,), k))
    for j in range(k + 1):
        reached = accepted >= j  # every draft before depth j accepted: row j emits a token
        counts = torch.bincount(sampled[reached, j], minlength=V)
        n = int(reached.sum())
        if j == 0:
            assert n == DRAWS
            tv = 0.5 * (counts / n - probs[0]).abs().sum().item()
            assert tv < 0.01, f"total variation {tv:.4f} at depth 0"
        if n >= 2000:
            p = chi_square_p(counts, probs[j])
            assert p > 0.01, f"depth {j}: chi-square p = {p:.4g} over {n} draws"
        # acceptance at depth j is the target's probability of the draft there: min(1, p/q)
        if j < k and n >= 2000:
            rate = (accepted[reached] > j).double().mean().item()
            sd = (probs[j][drafts[j]].item() * (1 - probs[j][drafts[j]].item()) / n) ** 0.5
            assert abs(rate - probs[j][drafts[j]].item()) < 5 * sd + 1e-9
