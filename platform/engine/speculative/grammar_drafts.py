"""Drafts of requests with structured output (a grammar): speculation stays exact.

Before the forward, a constrained request's drafts are cut at the first token its grammar
refuses from the matcher's current state (`allowed_prefix`): under the mask that token has
p = 0, so the rejection rule would reject it anyway; cutting it spends no verification row.
After the forward, each verification row gets the grammar's mask at its own position, the
state after the drafts before it (`fill_draft_masks`), so row j samples exactly as decoding
without speculation would after those tokens; the drafts are consumed by a copy of the
matcher (the request's own advances only by the tokens the step emits, as always). Draft-model drafts are not used for
these requests (their q would need the same masks): they draft by prompt lookup, whose
point-mass q holds only allowed tokens once cut.
"""

from __future__ import annotations

import torch

from loraplex.platform.engine.request import Request
from loraplex.platform.engine.structured.state import GrammarError, GrammarState


def allowed_prefix(state: GrammarState, drafts: list[int]) -> list[int]:
    """The longest prefix of `drafts` the grammar accepts from the matcher's state now (the
    matcher is not moved)."""
    if not drafts:
        return []
    return list(drafts[: int(state.matcher.validate_tokens(list(drafts)))])


def fill_draft_masks(mask: torch.Tensor, requests: list[Request], drafts: list[list[int]]) -> None:
    """Write into `mask` (one int32 row per verification row, request i's 1 + len(drafts[i])
    rows in order, each row filled with its request's mask now) the grammar's mask of every
    draft row: row j of a constrained request is its mask after drafts[:j]."""
    row = 0
    for r, d in zip(requests, drafts, strict=True):
        if d and r.grammar is not None:
            _fill(mask, row, r.grammar, d)
        row += len(d) + 1


def _fill(mask: torch.Tensor, row: int, state: GrammarState, drafts: list[int]) -> None:
    """Consume the drafts on a copy of the matcher (llguidance's rollback does not restore a
    matcher that consumed the grammar's end), writing the mask after each into its row."""
    matcher = state.matcher.deep_copy()
    size = mask.shape[1] * mask.element_size()
    for j, token in enumerate(drafts):
        if not matcher.consume_token(token):
            raise GrammarError(f"grammar {state.key[:12]} refused draft token {token} it "
                               f"allowed before the forward: {matcher.get_error()}")  # fmt: skip
        matcher.unsafe_compute_mask_ptr(mask[row + j + 1].data_ptr(), size)
