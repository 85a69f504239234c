"""Verification of drafted tokens against the target's own samples.

Each speculating request contributes K+1 rows of target logits: row j predicts the token after
its known tokens plus drafts[:j]. Every row is sampled by the engine's `Sampler`, as a view of
the request that already holds drafts[:j] (so penalties, min_tokens, `logit_bias`, the seeded
draw of that position and logprobs are exactly those of decoding without speculation), and the
drafts are kept up to the first row whose sample differs.

For a point-mass draft q (prompt lookup, suffix tables) this is Leviathan et al.'s rule: the
draft d is accepted with probability p(d) = min(1, p(d)/q(d)), and a rejected row's sample is
distributed as p conditioned on != d, i.e. norm(max(0, p - q)). Sharing the sampler's draw also
makes every output token the one decoding without speculation would sample at that position
(identical for greedy and for seeded requests).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampler import Sampler


@dataclass
class Verified:
    """Per request, the tokens it emits this step (accepted drafts, then the target's own
    sample) and their logprobs (None where not asked)."""

    tokens: list[list[int]]
    logprobs: list[list[dict[int, float]] | None]


def draft_view(request: Request, drafts: list[int]) -> Request:
    """The request as it would be with `drafts` already output (the sampler's view of a draft
    row); shares everything else with `request`."""
    if not drafts:
        return request
    return dataclasses.replace(request, output_token_ids=request.output_token_ids + drafts)


def num_accepted(
    drafts: torch.Tensor, sampled: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Per row, how many leading drafts equal the target's samples: drafts [N, K] (padding
    anywhere past `lengths`), sampled [N, K+1] -> [N] int64 in [0, lengths]."""
    k = drafts.shape[1]
    if k == 0:
        return torch.zeros(drafts.shape[0], dtype=torch.int64)
    live = torch.arange(k).unsqueeze(0) < lengths.unsqueeze(1)
    match = (drafts == sampled[:, :k]) & live
    return match.to(torch.int64).cumprod(dim=1).sum(dim=1)


def draft_views(
    requests: list[Request], drafts: list[list[int]]
) -> tuple[list[Request], list[int]]:
    """The sampler's requests for the rows of a verification: per request, itself and then a
    view per draft prefix; and, per row, the index of its request."""
    views: list[Request] = []
    owner: list[int] = []
    for i, (r, d) in enumerate(zip(requests, drafts, strict=True)):
        if d and r.grammar is not None:
            raise ValueError("a structured-output request cannot verify drafts")
        views += [draft_view(r, d[:j]) for j in range(len(d) + 1)]
        owner += [i] * (len(d) + 1)
    return views, owner


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    requests: list[Request],
    drafts: list[list[int]],
    mask: torch.Tensor | None = None,
) -> Verified:
    """Sample every row of `logits` [sum(1 + len(d)), V] (request i's 1 + len(drafts[i]) rows
    in order) and keep each request's accepted prefix. `mask` holds one structured-output row
    per request (constrained requests must not draft)."""
    views, owner = draft_views(requests, drafts)
    if mask is not None:
        mask = mask[torch.tensor(owner, dtype=torch.long, device=mask.device)]
    out = sampler(logits, views, mask)
    k_max = max(len(d) for d in drafts)
    n = len(requests)
    pad_d = torch.full((n, k_max), -1, dtype=torch.int64)
    pad_s = torch.full((n, k_max + 1), -2, dtype=torch.int64)
    row = 0
    for i, d in enumerate(drafts):
        pad_d[i, : len(d)] = torch.tensor(d, dtype=torch.int64)
        pad_s[i, : len(d) + 1] = torch.tensor(out.token_ids[row : row + len(d) + 1])
        row += len(d) + 1
    lengths = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
    accepted = num_accepted(pad_d, pad_s, lengths).tolist()
    tokens: list[list[int]] = []
    lps: list[list[dict[int, float]] | None] = []
    row = 0
    for d, a in zip(drafts, accepted, strict=True):
        tokens.append(out.token_ids[row : row + a + 1])
        got = out.logprobs[row : row + a + 1]
        lps.append(None if got[0] is None else got)  # type: ignore[arg-type]
        row += len(d) + 1
    return Verified(tokens, lps)
