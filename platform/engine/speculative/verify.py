"""Verification of drafted tokens against the target's own samples.

Each speculating request contributes K+1 rows of target logits: row j predicts the token after
its known tokens plus drafts[:j]. Every row is sampled by the engine's `Sampler`, as a view of
the request that already holds drafts[:j] (so penalties, min_tokens, `logit_bias`, the seeded
draw of that position and logprobs are exactly those of decoding without speculation), and the
drafts are kept up to the first row whose sample differs.

A draft model's drafts (`DraftTokens`, carrying the draft distribution q of each depth after
the request's own sampling settings) are verified by the full rule instead (`rejection_sample`):
the target's processed distribution p of each row (`Sampler.distribution`) accepts draft d with
probability min(1, p(d)/q(d)); the first rejected row emits a sample of norm(max(0, p - q)),
and a request whose drafts are all accepted emits a sample of its last row.

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
from loraplex.platform.engine.speculative.grammar_drafts import fill_draft_masks


class DraftTokens(list[int]):
    """Drafted tokens with the draft model's distribution at each depth (`probs` [K, V], the
    request's sampling settings applied): verified by the rejection rule, not by equality."""

    def __init__(self, tokens: list[int], probs: torch.Tensor) -> None:
        super().__init__(tokens)
        self.probs = probs


def rejection_sample(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    lengths: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al.'s rule over N drafting sequences: target p [N, K+1, V], draft q
    [N, K, V] (drafts sampled from it), drafts [N, K] (live up to `lengths`) -> (accepted
    drafts [N], the token emitted after them [N]: a sample of norm(max(0, p - q)) at the first
    rejection, else of p at the row after the last draft)."""
    n, k = drafts.shape
    dev = p.device
    idx = drafts.clamp(min=0).unsqueeze(2)
    pd = p[:, :k].gather(2, idx).squeeze(2)
    qd = q.gather(2, idx).squeeze(2)
    u = torch.rand(n, k, generator=generator, device=dev)
    live = torch.arange(k, device=dev).unsqueeze(0) < lengths.unsqueeze(1)
    ok = (u * qd < pd) & live  # accepted with probability min(1, p(d) / q(d))
    accepted = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rows = torch.arange(n, device=dev)
    p_at = p[rows, accepted]
    q_at = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)[rows, accepted]  # 0 past drafts
    residual = (p_at - q_at).clamp(min=0.0)
    total = residual.sum(dim=1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp(min=1e-30), p_at)
    final = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, final


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
    per request: a constrained request's draft rows get its grammar's mask after the drafts
    before them (`grammar_drafts.fill_draft_masks`)."""
    views, owner = draft_views(requests, drafts)
    if mask is not None:
        mask = mask[torch.tensor(owner, dtype=torch.long, device=mask.device)]
        fill_draft_masks(mask, requests, drafts)
    elif any(d and r.grammar is not None for r, d in zip(requests, drafts, strict=True)):
        raise RuntimeError("a constrained request's drafts reached verification without a mask")
    modelled = [i for i, d in enumerate(drafts) if isinstance(d, DraftTokens) and d]
    # Before sampling: the sampler adds logit_bias and the mask to `logits` in place.
    dist = _model_rows_distribution(sampler, logits, views, drafts, modelled, mask)
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
    if dist is not None:
        _verify_modelled(sampler, dist, drafts, modelled, tokens)
    return Verified(tokens, lps)


def _model_rows_distribution(
    sampler: Sampler,
    logits: torch.Tensor,
    views: list[Request],
    drafts: list[list[int]],
    modelled: list[int],
    mask: torch.Tensor | None,
) -> torch.Tensor | None:
    """The target's processed distribution p of the rows of the requests drafted by a model
    (`modelled`), in order; None when there are none."""
    if not modelled:
        return None
    starts, row = [], 0
    for d in drafts:
        starts.append(row)
        row += len(d) + 1
    sel = [r for i in modelled for r in range(starts[i], starts[i] + len(drafts[i]) + 1)]
    idx = torch.tensor(sel, dtype=torch.long, device=logits.device)
    return sampler.distribution(  # logits[idx] is a copy: the caller's rows stay unchanged
        logits[idx], [views[r] for r in sel], None if mask is None else mask[idx]
    )


def _verify_modelled(
    sampler: Sampler,
    dist: torch.Tensor,
    drafts: list[list[int]],
    modelled: list[int],
    tokens: list[list[int]],
) -> None:
    """Replace the emitted tokens of the requests drafted by a model (`modelled`, target
    distributions `dist` by row) by the rejection rule's (their requests never ask logprobs:
    the engine drafts them otherwise)."""
    k = max(len(drafts[i]) for i in modelled)
    m, v = len(modelled), dist.shape[-1]
    p = torch.zeros(m, k + 1, v, device=dist.device)
    q = torch.ones(m, k, v, device=dist.device) / v
    pad = torch.full((m, k), -1, dtype=torch.int64, device=dist.device)
    at = 0
    for j, i in enumerate(modelled):
        d = drafts[i]
        assert isinstance(d, DraftTokens)
        p[j, : len(d) + 1] = dist[at : at + len(d) + 1]
        q[j, : len(d)] = d.probs.to(dist.device)
        pad[j, : len(d)] = torch.tensor(list(d), dtype=torch.int64)
        at += len(d) + 1
    lengths = torch.tensor([len(drafts[i]) for i in modelled], device=dist.device)
    accepted, final = rejection_sample(p, q, pad, lengths, sampler.generator)
    for j, i in enumerate(modelled):
        a = int(accepted[j])
        tokens[i] = list(drafts[i][:a]) + [int(final[j])]
