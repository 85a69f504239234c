"""Quantized stacked expert weights [E, N, K]: int8 / int4 (g128, sym or asym) / fp8 e4m3.

Codes and scales follow the dense path's formats (`loader/quant/weight_only.py` quantizes and
defines the meaning): int8 and fp8 have one scale per output row, int4 one (scale, zero) per
row and group of `group` inputs. Storage per scheme (E experts, N output rows, K inputs):

- int8: codes int8 [E, N, K], scale [E, N] in the compute dtype (as `_weight_int8pack_mm`
  wants it);
- fp8: codes float8_e4m3fn [E, N, K], scale float32 [E, N];
- int4: two codes a byte, [E, N, K/2] uint8, and `scale` [E, K/group, N, 2] in the compute
  dtype holding (s, (8 - z) * s) per group, so `w = (q - 8) * s + zf` for symmetric and
  asymmetric alike (the layout of `torch._weight_int4pack_mm_for_cpu`'s scales-and-zeros).
  Codes are nibble-packed along K (`byte = q[2j] | q[2j + 1] << 4`), which the Triton kernel
  reads; on CPU, `to_cpu_int4_layout` repacks them once for PyTorch's int4 kernel.

The torch path multiplies one expert's rows at a time (`QuantizedExperts.matmul`); the Triton
path (`experts_triton.py`) dequantizes tiles in registers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from loraplex.loader.quant.schemes import QuantScheme
from loraplex.loader.quant.weight_only import (
    dequantize_fp8,
    dequantize_int8,
    quantize_fp8_per_channel,
    quantize_int4_grouped,
    quantize_int8_per_channel,
)

KINDS = ("int8", "int4", "fp8")
# Rows of one expert from which dequantize-then-matmul beats PyTorch's packed CPU kernels,
# whose time grows with the rows (GEMV-like). Measured on one expert 2816x1024, bf16 (noisy,
# shared machine): int8 packed 0.15 / 4.1 / 18 ms vs dequantized 1.7 / 4.2 / 5.0 ms at
# 16 / 64 / 256 rows; int4 (dequantized from the CPU layout, slower) packed 15 / 39 ms vs
# 39 / 123 ms at 256 / 512 rows with 2 threads, 104 vs 57 ms at 512 rows with one.
DEQUANT_ROWS = {"int8": 48, "int4": 512}


def expert_quant_kind(scheme: QuantScheme | None) -> str | None:
    """The expert storage a deployment scheme asks for (None: float experts)."""
    if scheme is None or not scheme.quantizes_linears:
        return None
    if scheme.kind not in KINDS:
        raise ValueError(f"no quantized expert storage for {scheme.name!r}")
    return scheme.kind


def code_shape(kind: str, n: int, k: int) -> tuple[int, int]:
    """Codes of one expert weight [n, k] (int4 packs two codes per byte)."""
    return (n, k // 2) if kind == "int4" else (n, k)


def code_dtype(kind: str) -> torch.dtype:
    """The dtype of `kind`'s codes."""
    return {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}[kind]


def scale_shape(kind: str, n: int, k: int, group: int) -> tuple[int, ...]:
    """Scales of one expert weight [n, k]."""
    return (k // group, n, 2) if kind == "int4" else (n,)


def scale_dtype(kind: str, compute: torch.dtype) -> torch.dtype:
    """int8 and int4 scales live in the compute dtype (the CPU kernels want that), fp8's in fp32."""
    return torch.float32 if kind == "fp8" else compute


def empty_stack(
    kind: str,
    slots: int,
    n: int,
    k: int,
    group: int,
    compute: torch.dtype,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (codes, scales) of a quantized stack [slots, n, k] (ValueError if int4's groups
    do not divide k)."""
    if kind == "int4" and k % group:
        raise ValueError(f"int4 experts need in_features ({k}) divisible by the group size {group}")
    codes = torch.empty(slots, *code_shape(kind, n, k), dtype=code_dtype(kind), device=device)
    dtype = scale_dtype(kind, compute)
    return codes, torch.empty(slots, *scale_shape(kind, n, k, group), dtype=dtype, device=device)


# a pre-quantized checkpoint's expert pieces (compressed-tensors, AWQ/GPTQ)
_PREQUANTIZED = re.compile(
    r"^experts\.\d+\.\w+\.(weight_packed|weight_scale|weight_zero_point|weight_shape|qweight"
    r"|qzeros|scales|g_idx)$"
)


def refuse_prequantized_expert(name: str) -> None:
    """NotImplementedError for a pre-quantized checkpoint's expert tensor (not read yet)."""
    if _PREQUANTIZED.match(name):
        raise NotImplementedError(
            f"{name}: pre-quantized MoE experts are not read yet; serve a bf16/fp16/fp32 "
            "checkpoint with quantization int8, int4, int4_sym or fp8 (experts are quantized "
            "on load), or one whose quantization config leaves the experts unquantized"
        )


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [..., K] (0..15) -> bytes [..., K/2] with the even code in the low nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`: [..., K/2] bytes -> [..., K] codes (uint8)."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)


def quantize_rows(
    kind: str, weight: torch.Tensor, group: int, symmetric: bool, compute: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows of one or more experts' weight [..., N, K] -> (codes, scales) as stored.

    Rows are independent (per-row scales), so a gate half, an up half or a whole fused [E, N, K]
    stack quantizes the same way. int4 scales come back [..., K/group, N, 2].
    """
    lead, (n, k) = weight.shape[:-2], weight.shape[-2:]
    flat = weight.reshape(-1, k)
    if kind == "int8":
        q, s = quantize_int8_per_channel(flat)
    elif kind == "fp8":
        q, s = quantize_fp8_per_channel(flat)
    elif kind == "int4":
        q, s, z = quantize_int4_grouped(flat, group, symmetric=symmetric)
        sz = torch.stack([s, (8.0 - z) * s], dim=-1)  # [rows, G, 2]
        sz = sz.reshape(*lead, n, k // group, 2).transpose(-3, -2)  # [..., G, N, 2]
        return pack_nibbles(q).reshape(*lead, n, k // 2), sz.to(compute).contiguous()
    else:
        raise ValueError(f"unknown expert quantization {kind!r}")
    return q.reshape(*lead, n, k), s.reshape(*lead, n).to(scale_dtype(kind, compute))


CPU_INT4_BLOCK = 64  # rows PyTorch's CPU int4 packer interleaves (when N is a multiple)


def from_cpu_int4_layout(packed: torch.Tensor) -> torch.Tensor:
    """One expert's codes [N, K] (uint8 0..15) back from `_convert_weight_to_int4pack_for_cpu`'s
    layout for N a multiple of 64: per block of 64 rows and per input, 32 bytes, byte j holding
    row j (low nibble) and row j + 32 (high nibble)."""
    n, half_k = packed.shape
    bn = CPU_INT4_BLOCK
    b = packed.view(n // bn, half_k * 2, bn // 2)  # [blocks, K, 32]
    rows = torch.cat([b & 15, b >> 4], dim=-1)  # [blocks, K, 64]
    return rows.permute(0, 2, 1).reshape(n, half_k * 2)


def to_cpu_int4_layout(packed: torch.Tensor) -> torch.Tensor | None:
    """Nibble-packed int4 codes [E, N, K/2] -> `_weight_int4pack_mm_for_cpu`'s layout, per
    expert; None when N is not a multiple of 64 or this PyTorch packs differently from what
    `from_cpu_int4_layout` reads (checked on the first expert): the codes then stay nibbles."""
    if packed.shape[1] % CPU_INT4_BLOCK:
        return None
    out = torch.empty_like(packed)
    for e in range(packed.shape[0]):
        codes = unpack_nibbles(packed[e])
        out[e] = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        if e == 0 and not torch.equal(from_cpu_int4_layout(out[0]), codes):
            return None
    return out


@lru_cache(maxsize=1)
def _fp8_values() -> torch.Tensor:
    """The 256 e4m3 values as float32, by bit pattern (dequantizing by lookup is exact)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


@dataclass(frozen=True)
class QuantizedExperts:
    """A stacked expert weight [E, N, K] stored quantized; `shape` is the logical shape."""

    kind: str
    codes: torch.Tensor
    scale: torch.Tensor
    group: int = 0
    cpu_int4: bool = False  # codes in `_weight_int4pack_mm_for_cpu`'s layout, not nibbles

    @property
    def shape(self) -> torch.Size:
        e, n, kc = self.codes.shape
        return torch.Size((e, n, kc * 2 if self.kind == "int4" else kc))

    def dim(self) -> int:
        """Always 3 (stacked experts), like the float stack it replaces."""
        return 3

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dequantize(self, expert: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert `expert`'s weight [N, K] as `dtype` (the reference the kernels must match)."""
        if self.kind == "int8":
            if self.scale.dtype == dtype:  # q and s exact in dtype: one rounding, as in fp32
                return self.codes[expert].to(dtype) * self.scale[expert][:, None]
            return dequantize_int8(self.codes[expert], self.scale[expert], dtype)
        if self.kind == "fp8":
            if self.codes.device.type == "cpu":  # a table beats PyTorch's scalar fp8 cast
                q = _fp8_values().index_select(
                    0, self.codes[expert].view(torch.uint8).flatten().int()
                )
                return q.view(self.codes.shape[1:]).mul_(self.scale[expert][:, None]).to(dtype)
            return dequantize_fp8(self.codes[expert], self.scale[expert], dtype)
        n, k = self.shape[1:]
        codes = self.codes[expert]
        q = from_cpu_int4_layout(codes) if self.cpu_int4 else unpack_nibbles(codes)
        q = q.float().view(n, k // self.group, self.group)
        sz = self.scale[expert].float()  # [G, N, 2]
        s, zf = sz[..., 0].t(), sz[..., 1].t()  # [N, G]
        return ((q - 8.0) * s[..., None] + zf[..., None]).view(n, k).to(dtype)

    def matmul(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """x [M, K] @ W_expert^T -> [M, N] in x's dtype: on CPU PyTorch's packed kernels for
        few rows, dequantize-then-matmul for many (`DEQUANT_ROWS`)."""
        few = x.shape[0] < DEQUANT_ROWS.get(self.kind, 0)
        if x.device.type == "cpu" and self.kind == "int8" and few:
            scale = self.scale[expert]
            return torch._weight_int8pack_mm(x.contiguous(), self.codes[expert], scale.to(x.dtype))
        if self.cpu_int4 and x.device.type == "cpu" and few:
            sz = self.scale[expert].to(x.dtype)
            return torch._weight_int4pack_mm_for_cpu(
                x.contiguous(), self.codes[expert], self.group, sz
            )
        return F.linear(x, self.dequantize(expert, x.dtype))
