"""The flattened-batch description attention needs to read and write the paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """T tokens from S sequences, each sequence's tokens contiguous and in order.

    Tensors live on the model's device. `max_query_len`, `max_seq_len` and `is_decode_only`
    are host-side so the decode path never has to synchronise with the device.
    """

    slot_mapping: torch.Tensor  # [T] int64; block_id * block_size + offset, -1 = don't write
    query_start_loc: torch.Tensor  # [S+1] int32; cumulative query lengths
    seq_lens: torch.Tensor  # [S] int32; cached + new tokens after this step
    context_lens: torch.Tensor  # [S] int32; tokens already in the cache before this step
    block_tables: torch.Tensor  # [S, max_blocks] int32; physical block ids padded with 0
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool
    # per-step memo for attention backends (e.g. host copies of the lengths), shared by layers
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        """S, the number of sequences in the batch."""
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """T, the number of tokens in the batch (including padding slots)."""
        return int(self.slot_mapping.shape[0])
