"""Expert parallelism: token dispatch to the ranks holding their experts, and back.

Attention runs replicated on every rank, so every rank has the whole batch. In a MoE
block rank r takes its contiguous shard of the tokens, routes them, and sends each
(token, k) pair's hidden row to the rank of the chosen expert copy with
`all_to_all_single` (counts first, then the payload); the expert rank computes, sends the
rows back the same way, the source weights and sums them per token, and an all-gather
rebuilds the full batch on every rank. gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from loraplex.moe.experts_torch import weighted_pair_sum
from loraplex.moe.placement import ExpertPlacement

RowCompute = Callable[..., torch.Tensor]


class ExpertParallelGroup:
    """One rank's handle on the expert-parallel process group."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; start ranks via ep_launch")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def token_bounds(self, num_tokens: int) -> list[int]:
        """Shard boundaries: rank r owns tokens [b[r], b[r+1])."""
        w = self.world_size
        return [num_tokens * r // w for r in range(w + 1)]

    def _exchange(
        self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        recv = send.new_empty((sum(recv_counts), *send.shape[1:]))
        dist.all_to_all_single(
            recv,
            send.contiguous(),
            output_split_sizes=recv_counts,
            input_split_sizes=send_counts,
            group=self.group,
        )
        return recv

    def dispatch_combine(
        self,
        hidden: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        placement: ExpertPlacement,
        compute: RowCompute,
        pair_offset: int = 0,
        token_tags: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """sum_k w[t,k] * Expert_{id[t,k]}(hidden[t]) for this rank's tokens, experts anywhere.

        `compute(rows, local_slots)` runs this rank's experts on received rows; with
        `token_tags` ([T] int64, e.g. each token's adapter slot) every row travels with its
        token's tag and `compute(rows, local_slots, tags)` gets them.
        """
        if placement.world_size != self.world_size:
            raise ValueError(
                f"placement is for {placement.world_size} ranks, group has {self.world_size}"
            )
        top_k = topk_ids.shape[1]
        dest_rank, dest_slot = placement.route_pairs(topk_ids, pair_offset)
        order = torch.argsort(dest_rank, stable=True)
        send_counts_t = torch.bincount(dest_rank, minlength=self.world_size)
        recv_counts_t = torch.empty_like(send_counts_t)
        dist.all_to_all_single(recv_counts_t, send_counts_t, group=self.group)
        send_counts, recv_counts = send_counts_t.tolist(), recv_counts_t.tolist()

        token_of_pair = order // top_k
        recv_rows = self._exchange(hidden[token_of_pair], send_counts, recv_counts)
        recv_slots = self._exchange(dest_slot[order], send_counts, recv_counts)
        if token_tags is None:
            out_rows = compute(recv_rows, recv_slots)
        else:
            tags = self._exchange(token_tags[token_of_pair], send_counts, recv_counts)
            out_rows = compute(recv_rows, recv_slots, tags)
        back = self._exchange(out_rows, recv_counts, send_counts)

        return weighted_pair_sum(back.to(hidden.dtype), order, topk_weights)

    def all_gather_tokens(self, local: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        """Concatenate every rank's token shard (sizes from `bounds`) into the full batch."""
        sizes = [bounds[r + 1] - bounds[r] for r in range(self.world_size)]
        width = max(sizes)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)], dim=0)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks (in place) and return it."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def migrate_experts(
        self,
        old: ExpertPlacement,
        new: ExpertPlacement,
        tensors: list[torch.Tensor],
    ) -> list[torch.Tensor]:
        """Move expert weights from `old` to `new` placement; returns this rank's new tensors.

        `tensors` are per-slot stacks ([slots, ...]) laid out by `old`. Experts a rank keeps
        are copied locally; others come from their first old holder in one all-to-all. Every
        rank must call this at the same step (it is collective).
        """
        me, world = self.rank, self.world_size
        first_holder: dict[int, int] = {}
        for rank, experts in enumerate(old.rank_experts):
            for e in experts:
                first_holder.setdefault(e, rank)
        flat = torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)
        my_old_slots = old.slots_of(me)
        send_rows: list[int] = []
        send_counts = [0] * world
        recv_counts = [0] * world
        for dest in range(world):
            dest_old = old.slots_of(dest)
            for e in new.rank_experts[dest]:
                if e in dest_old:
                    continue
                src = first_holder[e]
                if src == me:
                    send_rows.append(my_old_slots[e])
                    send_counts[dest] += 1
                if dest == me:
                    recv_counts[src] += 1
        send = flat[send_rows] if send_rows else flat.new_zeros((0, flat.shape[1]))
        recv = self._exchange(send, send_counts, recv_counts)
        # Received rows arrive grouped by source rank, each in the order of my new slots.
        recv_offsets = [sum(recv_counts[:r]) for r in range(world)]
        new_flat = flat.new_empty((len(new.rank_experts[me]), flat.shape[1]))
        for slot, e in enumerate(new.rank_experts[me]):
            if e in my_old_slots:
                new_flat[slot] = flat[my_old_slots[e]]
            else:
                src = first_holder[e]
                new_flat[slot] = recv[recv_offsets[src]]
                recv_offsets[src] += 1
        out, col = [], 0
        for t in tensors:
            width = t[0].numel()
            out.append(new_flat[:, col : col + width].reshape(-1, *t.shape[1:]).clone())
            col += width
        return out


_process_group: ExpertParallelGroup | None = None


def set_process_ep_group(ep: ExpertParallelGroup | None) -> None:
    """Make `ep` this process's expert-parallel group (each EP rank is its own process).

    MoE models built without an explicit `ep=` pick it up, so the engine's ordinary model
    loading builds rank-local models inside a spawned rank.
    """
    global _process_group
    _process_group = ep


def process_ep_group() -> ExpertParallelGroup | None:
    """This process's expert-parallel group, None outside an EP rank (or once it is torn down)."""
    if _process_group is not None and not dist.is_initialized():
        return None
    return _process_group
