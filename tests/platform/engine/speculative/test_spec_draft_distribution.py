"""Exactness of draft-model speculation (Leviathan et al.'s rule): a second tiny random model
(same 16-token vocabulary, other weights) drafts K tokens from its distribution q; the engine's
`rejection_sample` accepts each with min(1, p/q) and otherwise resamples from
norm(max(0, p - q)), after temperature, top-p and a penalty are applied to both p and q by the
engine's Sampler. Per setting, 200,000 speculative steps, each drafting its own tokens: the token
emitted at depth 0 follows the target's distribution (chi-square p > 0.01, total variation
< 0.01, against transformers logits processed here from scratch), and at depth 1 and 2, per
prefix reached often, chi-square p > 0.01 against the target's distribution after it."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.peft_adapters import make_adapter  # noqa: E402
from test_spec_distribution import V, chi_square_p, reference_probs  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.platform.engine.request import Request  # noqa: E402
from loraplex.platform.engine.sampler import Sampler  # noqa: E402
from loraplex.platform.engine.sampling_params import SamplingParams  # noqa: E402
from loraplex.platform.engine.speculative.verify import draft_view, rejection_sample  # noqa: E402

DRAWS = 200_000
PROMPT = [3, 9, 4, 12, 7, 3, 9]
OUTPUT = [4, 12, 5]
# (temperature, top_p, presence_penalty, K, adapter on the target)
SETTINGS = [
    (0.3, 1.0, 0.0, 1, False),
    (1.0, 1.0, 0.0, 3, True),
    (1.5, 0.9, 0.0, 3, False),
    (1.0, 1.0, 1.0, 2, True),
    (1.0, 0.8, 0.0, 5, False),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    from peft import PeftModel

    path = tmp_path_factory.mktemp("target")
    target = save_tiny_model(path, "llama", seed=5, with_tokenizer=False, vocab_size=V).eval()
    adapter = make_adapter(target, tmp_path_factory.mktemp("a"), seed=8, r=4, lora_alpha=16,
                           target_modules="all-linear")  # fmt: skip
    peft = PeftModel.from_pretrained(save_tiny_model(
        tmp_path_factory.mktemp("copy"), "llama", seed=5, with_tokenizer=False, vocab_size=V
    ), str(adapter)).eval()  # fmt: skip
    draft = save_tiny_model(
        tmp_path_factory.mktemp("draft"), "llama", seed=6, with_tokenizer=False, vocab_size=V
    ).eval()
    return target, peft, draft


def last_logits(model, contexts: torch.Tensor) -> torch.Tensor:
    """Logits after each context [N, L] -> [N, V] (fp32)."""
    with torch.no_grad():
        return torch.cat([model(c).logits[:, -1].float() for c in contexts.split(4096)])


@pytest.mark.parametrize("temp,top_p,pres,k,with_adapter", SETTINGS)
def test_draft_model_speculation_follows_the_target(models, temp, top_p, pres, k, with_adapter):
    target_hf, peft, draft_hf = models
    target = peft if with_adapter else target_hf
    params = SamplingParams(temperature=temp, top_p=top_p, presence_penalty=pres)
    request = Request("r", PROMPT, params, output_token_ids=list(OUTPUT))
    sampler = Sampler(seed=3)
    gen = torch.Generator().manual_seed(23)
    context = torch.tensor(PROMPT + OUTPUT)

    def processed(model, prefixes: torch.Tensor) -> torch.Tensor:
        """The Sampler's distribution after each distinct draft prefix, per draw [DRAWS, V]."""
        if prefixes.shape[1] == 0:
            uniq, inverse = prefixes[:1], torch.zeros(len(prefixes), dtype=torch.int64)
        else:
            uniq, inverse = torch.unique(prefixes, dim=0, return_inverse=True)
        ctx = torch.cat([context.expand(len(uniq), -1), uniq], dim=1)
        logits = last_logits(model, ctx)
        views = [draft_view(request, row.tolist()) for row in uniq]
        return sampler.distribution(logits, views)[inverse]

    drafts = torch.empty(DRAWS, 0, dtype=torch.int64)
    q_rows, p_rows = [], []
    for _ in range(k):  # each draw drafts its own tokens from q
        q = processed(draft_hf, drafts)
        q_rows.append(q)
        p_rows.append(processed(target, drafts))
        drafts = torch.cat([drafts, torch.multinomial(q, 1, generator=gen)], dim=1)
    p_rows.append(processed(target, drafts))
    p, q = torch.stack(p_rows, 1), torch.stack(q_rows, 1)  # [N, K+1, V], [N, K, V]
    accepted, final = rejection_sample(p, q, drafts, torch.full((DRAWS,), k), gen)
    emitted = torch.cat([drafts, torch.full((DRAWS, 1), -1)], dim=1)
    emitted[torch.arange(DRAWS), accepted] = final

    def reference(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = target(torch.tensor([PROMPT + OUTPUT + prefix])).logits[0, -1].float()
        return reference_probs(logits, OUTPUT + prefix, temp, top_p, pres)

    counts = torch.bincount(emitted[:, 0], minlength=V)
    ref0 = reference([])
    tv = 0.5 * (counts / DRAWS - ref0).abs().sum().item()
    assert tv < 0.01, f"total variation {tv:.4f} at depth 0"
    assert chi_square_p(counts, ref0) > 0.01
    tested = 0
    for depth in range(1, min(k, 2) + 1):
        reached = accepted >= depth
        prefixes, n = torch.unique(emitted[reached, :depth], dim=0, return_counts=True)
        for prefix, m in zip(prefixes.tolist(), n.tolist(), strict=True):
            if m < 3000:
                continue
            rows = reached & (emitted[:, :depth] == torch.tensor(prefix)).all(1)
            got = torch.bincount(emitted[rows, depth], minlength=V)
            p_val = chi_square_p(got, reference(prefix))
            assert p_val > 0.01, f"depth {depth} after {prefix}: chi-square p = {p_val:.4g}"
            tested += 1
    assert k == 1 or tested > 0, "no prefix reached often enough to test a deeper depth"
    if k > 1:  # the draft really is accepted sometimes and rejected sometimes
        assert 0.05 < (accepted > 0).double().mean().item() < 0.999


def test_greedy_rows_accept_exactly_the_targets_argmax() -> None:
    p = torch.nn.functional.one_hot(torch.tensor([[3, 5, 7], [3, 5, 7]]), 8).float()
    q = torch.nn.functional.one_hot(torch.tensor([[3, 6], [3, 5]]), 8).float()
    drafts = torch.tensor([[3, 6], [3, 5]])
    accepted, final = rejection_sample(p, q, drafts, torch.tensor([2, 2]), torch.Generator())
    assert accepted.tolist() == [1, 2] and final.tolist() == [5, 7]


def test_the_engines_verify_applies_the_rule_to_model_drafts() -> None:
    """Through `verify` (the runner's call): 200,000 requests in one batch, each with one
    draft sampled from its own q (DraftTokens), temperature 0.8 and a logit_bias: the first
    emitted token follows the target's processed distribution (TV < 0.01, chi-square)."""
    from loraplex.platform.engine.speculative.verify import DraftTokens, verify

    n = DRAWS
    g = torch.Generator().manual_seed(5)
    target = torch.randn(V, generator=g) * 2
    bias = {3: 1.5}
    params = SamplingParams(temperature=0.8, logit_bias=bias)
    shifted = target.clone()
    shifted[3] += 1.5
    p0 = torch.softmax(shifted / 0.8, -1)
    q = torch.softmax(torch.randn(V, generator=g) * 2, -1)  # the draft's, far from p
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    request = Request("r", PROMPT, params, output_token_ids=list(OUTPUT))
    probs = q.unsqueeze(0)
    logits = torch.stack([target, torch.randn(V, generator=g)]).repeat(n, 1)
    got = verify(Sampler(seed=9), logits, [request] * n, [DraftTokens([d], probs) for d in drafts])
    first = torch.tensor([t[0] for t in got.tokens])
    counts = torch.bincount(first, minlength=V)
    tv = 0.5 * (counts / n - p0).abs().sum().item()
    assert tv < 0.01, f"total variation {tv:.4f}"
    assert chi_square_p(counts, p0) > 0.01
    accepted = sum(len(t) - 1 for t in got.tokens) / n
    expected = torch.minimum(p0, q).sum().item()  # P(accept) = sum_x min(p, q)
    assert abs(accepted - expected) < 0.01, (accepted, expected)
