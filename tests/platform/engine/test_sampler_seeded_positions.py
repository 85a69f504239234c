"""Seeded sampling draws from a generator keyed by (seed, position) (issue 23): a request's
draw at a position does not depend on the draws before it, on its row in the batch, or on the
other requests sampled beside it, so a seeded request resumed from its own prefix (a restart,
a recompute) continues exactly as it would have."""

from __future__ import annotations

import torch

from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampler import Sampler
from loraplex.platform.engine.sampling_params import SamplingParams

VOCAB = 1000


def _logits(step: int) -> torch.Tensor:
    """Flat-ish logits: many tokens compete, so a different draw picks a different one."""
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(100 + step)) * 0.1


def _request(rid: str, prompt: list[int], seed: int | None) -> Request:
    return Request(rid, list(prompt), SamplingParams(temperature=1.0, seed=seed, max_tokens=50))


def _sample(sampler: Sampler, rows: list[tuple[Request, torch.Tensor]]) -> list[int]:
    logits = torch.stack([row for _, row in rows])
    return sampler(logits, [r for r, _ in rows]).token_ids


def test_a_seeded_request_resumed_from_its_prefix_draws_the_same_tokens() -> None:
    """Ten tokens drawn one by one; a new request whose prompt is the first prompt plus the
    first five tokens draws the last five again (same seed, same logits per position)."""
    prompt = [3, 1, 4, 1, 5]
    whole = _request("a", prompt, seed=7)
    sampler = Sampler(seed=0)
    for step in range(10):
        (tok,) = _sample(sampler, [(whole, _logits(len(prompt) + step))])
        whole.output_token_ids.append(tok)
    resumed = _request("b", prompt + whole.output_token_ids[:5], seed=7)
    for step in range(5, 10):
        (tok,) = _sample(Sampler(seed=1), [(resumed, _logits(len(prompt) + step))])
        resumed.output_token_ids.append(tok)
    assert resumed.output_token_ids == whole.output_token_ids[5:]


def test_a_seeded_draw_ignores_its_row_and_its_neighbours() -> None:
    """The same request and logits alone, and at row 3 of a batch of seeded and unseeded
    requests (one with the same seed): the same token at every position."""
    prompt = [9, 9, 8]
    alone, crowded = _request("a", prompt, 11), _request("b", prompt, 11)
    others = [_request(f"o{i}", [i + 1], seed) for i, seed in enumerate((11, None, 5, None))]
    sampler = Sampler(seed=0)
    for step in range(6):
        row = _logits(len(prompt) + step)
        (a,) = _sample(Sampler(seed=3), [(alone, row)])
        batch = [(o, _logits(50 + i)) for i, o in enumerate(others)]
        batch.insert(3, (crowded, row))
        b = _sample(sampler, batch)[3]
        assert a == b, step
        alone.output_token_ids.append(a)
        crowded.output_token_ids.append(b)
        for o in others:
            o.output_token_ids.append(0)
