"""How a MoE block stores its expert weights: float stacks, or quantized ones (int8 / int4 /
fp8, `quant_experts.py`) filled by quantizing each checkpoint tensor as it is loaded.

A mixin of `MoEBlock`: stacks are parameters `<name>` [slots, N, K] (codes when quantized) with
`<name>_scale`; the routed experts are `w13` / `w2`, a quantized shared expert is the one-slot
stacks `shared_w13` / `shared_w2` (a float shared expert keeps its plain 2-D weights).
"""

from __future__ import annotations

import torch
from torch import nn

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.moe.packed_experts import PackedExperts, can_pack_experts
from loraplex.moe.quant_experts import (
    QuantizedExperts,
    empty_stack,
    expert_quant_kind,
    quantize_rows,
    to_cpu_int4_layout,
)


class ExpertStorage:
    """Float or quantized expert stacks; `_init_storage` first, then `_stack_param` each."""

    def _init_storage(self, quant: QuantScheme | None, dtype: torch.dtype) -> None:
        self.compute_dtype = dtype
        self.quant_kind = expert_quant_kind(quant)
        self.quant_group = quant.group_size if quant is not None else 0
        self.quant_symmetric = quant.symmetric if quant is not None else True
        self._stacks: list[str] = []
        self._cpu_int4: set[str] = set()  # stacks repacked for PyTorch's CPU int4 kernel
        # Float stacks packed for oneDNN on a CPU: the parameter keeps only its shape (meta).
        self._packed: dict[str, PackedExperts] = {}

    @property
    def cpu_int4(self) -> bool:
        """Whether the routed experts' int4 codes are in PyTorch's CPU kernel layout."""
        return {"w13", "w2"} <= self._cpu_int4

    def _stack_param(
        self, name: str, slots: int, n: int, k: int, device: torch.device | str | None
    ) -> None:
        """Register the empty stack `name` [slots, n, k] (codes and `name_scale` if quantized)."""
        self._stacks.append(name)
        if self.quant_kind is None:
            weight = torch.empty(slots, n, k, dtype=self.compute_dtype, device=device)
            setattr(self, name, nn.Parameter(weight, requires_grad=False))
            setattr(self, f"{name}_scale", None)
            return
        codes, scale = empty_stack(
            self.quant_kind, slots, n, k, self.quant_group, self.compute_dtype, device
        )
        setattr(self, name, nn.Parameter(codes, requires_grad=False))
        setattr(self, f"{name}_scale", nn.Parameter(scale, requires_grad=False))

    def _put(self, name: str, index: tuple[int | slice, ...], tensor: torch.Tensor) -> None:
        """Write a float tensor into stack `name`[index] (index: a slot or all slots, then
        rows), quantizing it first when the stack is quantized."""
        param = getattr(self, name)
        if self.quant_kind is None:
            param[index].copy_(tensor)
            return
        if name in self._cpu_int4:
            raise ValueError(f"{name}: int4 codes were already repacked for the CPU kernel")
        if isinstance(index[0], slice):  # a whole stack: one slot at a time
            for slot, part in zip(range(param.shape[0])[index[0]], tensor, strict=True):
                self._put(name, (slot, *index[1:]), part)
            return
        codes, scale = quantize_rows(
            self.quant_kind, tensor, self.quant_group, self.quant_symmetric, self.compute_dtype
        )
        param[index].copy_(codes)
        scales = getattr(self, f"{name}_scale")
        if self.quant_kind == "int4":  # scales [slots, G, N, 2]: rows are the third dim
            scales[(index[0], slice(None), *index[1:])].copy_(scale)
        else:
            scales[index].copy_(scale)

    def _finish_loading(self) -> None:
        """Once every weight is in: pack float stacks for oneDNN on a CPU; repack int4 stacks
        for PyTorch's CPU kernel (on CPU, rows in multiples of 64; otherwise the codes stay
        nibbles and are dequantized)."""
        if self.quant_kind is None:
            for name in self._stacks:
                self._pack(name, getattr(self, name).data)
            return
        if self.quant_kind != "int4":
            return
        for name in self._stacks:
            param = getattr(self, name)
            if param.device.type != "cpu" or name in self._cpu_int4:
                continue
            packed = to_cpu_int4_layout(param.data)
            if packed is not None:
                param.data = packed
                self._cpu_int4.add(name)

    def _pack(self, name: str, dense: torch.Tensor) -> None:
        """Pack float stack `name` for oneDNN where this CPU can (else keep it dense)."""
        if not can_pack_experts(dense):
            self._packed.pop(name, None)
            setattr(self, name, nn.Parameter(dense, requires_grad=False))
            return
        self._packed[name] = PackedExperts(dense)
        meta = torch.empty(dense.shape, dtype=dense.dtype, device="meta")
        setattr(self, name, nn.Parameter(meta, requires_grad=False))

    def unpack_stacks(self) -> None:
        """Hold every oneDNN-packed float stack as a plain tensor again (the deterministic
        mode's kernels read plain stacks)."""
        for name in list(self._packed):
            dense = self._packed.pop(name).dense()
            setattr(self, name, nn.Parameter(dense.contiguous(), requires_grad=False))

    def dense_stack(self, name: str) -> torch.Tensor:
        """Stack `name`'s stored tensor as a plain one (packed float stacks unpacked)."""
        packed = self._packed.get(name)
        return packed.dense() if packed is not None else getattr(self, name).data

    def set_stack(self, name: str, tensor: torch.Tensor) -> None:
        """Replace stack `name` (e.g. moved experts), packing it again if it was packed."""
        if name in self._packed:
            self._pack(name, tensor)
        else:
            setattr(self, name, nn.Parameter(tensor, requires_grad=False))

    def stack(self, name: str) -> torch.Tensor | QuantizedExperts | PackedExperts:
        """Stack `name` as the expert kernels take it: a float tensor, `PackedExperts` or
        `QuantizedExperts`."""
        param: nn.Parameter = getattr(self, name)
        if name in self._packed:
            return self._packed[name]
        if self.quant_kind is None:
            return param
        scale = getattr(self, f"{name}_scale")
        return QuantizedExperts(
            self.quant_kind, param, scale, self.quant_group, name in self._cpu_int4
        )

    def _filled_scales(self, done: set[str]) -> set[str]:
        """The scale parameters that are complete once the stacks in `done` are."""
        if self.quant_kind is None:
            return set()
        return {f"{n}_scale" for n in self._stacks if n in done}
