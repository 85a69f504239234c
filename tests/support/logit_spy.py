"""Record the logits rows an engine samples from, per request id, for comparing against an
oracle (transformers, peft) row by row."""

from __future__ import annotations

from typing import Any

import torch


def record_sampled_logits(llm: Any) -> dict[str, list[torch.Tensor]]:  # noqa: ANN401
    """Wrap `llm`'s sampler call: every logits row (full vocab, fp32) lands in the returned
    dict under its request id, in step order."""
    rows: dict[str, list[torch.Tensor]] = {}
    runner = llm.core.runner
    inner = runner._sample

    def spy(sampling, logits, prompt_lps):  # noqa: ANN001, ANN202
        if logits is not None:
            for s, row in zip(sampling, logits, strict=True):
                rows.setdefault(s.request.request_id, []).append(row.detach().float().clone())
        return inner(sampling, logits, prompt_lps)

    runner._sample = spy
    return rows
