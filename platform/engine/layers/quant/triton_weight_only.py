"""Triton W8A16 / W4A16 GEMMs: y[M, N] = x[M, K] @ dequant(W)[N, K]^T, dequantized in registers.

The layouts these kernels read (defined here and nowhere else):

- int8 (W8A16): codes int8 [N, K], one scale per output channel [N]; `w = q * s`.
- int4 (W4A16): `pack_int4` stores the codes 0..15 two per byte along K: byte [n, j] holds
  code k = 2j in its low nibble and k = 2j + 1 in its high nibble (uint8 [N, K / 2]); scales
  fp32 [N, K / group], asymmetric zero points [N, K / group] (integer-valued floats; symmetric
  uses 8 everywhere); `w = (q - z) * s`, the meaning `loader.quant.weight_only` defines.

Each program owns a [BM, BN] tile of y and walks K in BK steps; a BK step never straddles an
int4 group (BK divides the group size), so it multiplies the integer codes minus the zero point
(exact in bf16/fp16) and scales the fp32 partial product once per output column. An int4 step
reads its BK / 2 bytes once, dense along K, and multiplies the low nibbles by x's even columns
and the high nibbles by its odd columns (two dots), so codes are never interleaved in
registers. Accumulation is fp32; y comes back contiguous in x's dtype.

Strides: the codes, scales and zero points must be contiguous (ValueError otherwise: they are
packed at load time, so a strided one is a bug). x may have any row stride but its last
dimension must be dense: an x whose last dimension is not stride 1 (a transposed view) is
copied with `.contiguous()` first. Tested on CPU under `TRITON_INTERPRET=1`; the engine runs
them on CUDA only.
"""

from __future__ import annotations

import os

import torch

from loraplex.loader.tensor_layout import require_contiguous

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux test/GPU dependency
    HAS_TRITON = False

W4A16_GROUP_MULTIPLE = 32  # a K step holds two dots over BK / 2 >= 16 bytes inside one group

# Triton reads this when the kernels are defined, so it is fixed for the process
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def triton_weight_only_available(t: torch.Tensor) -> bool:
    """True when these kernels can run natively on t's device (CUDA with triton installed)."""
    return HAS_TRITON and t.is_cuda


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 uint8 [N, K] (K even) -> uint8 [N, K / 2], code 2j low nibble, 2j+1 high."""
    if codes.ndim != 2 or codes.shape[1] % 2:
        raise ValueError(f"int4 packing needs codes [N, K] with K even, got {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: uint8 [N, K / 2] -> codes uint8 [N, K]."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


if HAS_TRITON:

    @triton.jit
    def _w8a16_kernel(
        x_ptr,
        w_ptr,
        s_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_ym,
        DOT_F32: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_m = offs_m < M
        mask_n = offs_n < N
        rows_x = offs_m.to(tl.int64) * stride_xm
        rows_w = offs_n.to(tl.int64) * K
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + offs_k
            mask_k = kk < K
            x = tl.load(
                x_ptr + rows_x[:, None] + kk[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            q = tl.load(  # [BK, BN]: the weight tile already transposed
                w_ptr + rows_w[None, :] + kk[:, None],
                mask=mask_n[None, :] & mask_k[:, None],
                other=0,
            )
            if DOT_F32:
                acc += tl.dot(x.to(tl.float32), q.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(x, q.to(x.dtype))
        s = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc * s[None, :]
        tl.store(
            y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )

    @triton.jit
    def _w4a16_kernel(
        x_ptr,
        w_ptr,
        s_ptr,
        z_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_ym,
        GROUP: tl.constexpr,
        HAS_ZERO: tl.constexpr,
        DOT_F32: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_b = tl.arange(0, BK // 2)  # the tile's bytes along K
        mask_m = offs_m < M
        mask_n = offs_n < N
        rows_x = offs_m.to(tl.int64) * stride_xm
        rows_w = offs_n.to(tl.int64) * (K // 2)
        rows_s = offs_n.to(tl.int64) * (K // GROUP)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kb = k0 // 2 + offs_b
            # even k meet the low nibbles, odd k the high ones: no interleaving in registers
            x_even = tl.load(
                x_ptr + rows_x[:, None] + 2 * kb[None, :], mask=mask_m[:, None], other=0.0
            )
            x_odd = tl.load(
                x_ptr + rows_x[:, None] + 2 * kb[None, :] + 1, mask=mask_m[:, None], other=0.0
            )
            b = tl.load(w_ptr + rows_w[None, :] + kb[:, None], mask=mask_n[None, :], other=0)
            lo = (b & 0xF).to(tl.float32)  # [BK / 2, BN]: each byte read once, dense along K
            hi = (b >> 4).to(tl.float32)
            g = k0 // GROUP
            s = tl.load(s_ptr + rows_s + g, mask=mask_n, other=0.0).to(tl.float32)
            if HAS_ZERO:
                z = tl.load(z_ptr + rows_s + g, mask=mask_n, other=0.0).to(tl.float32)
            else:
                z = tl.full([BN], 8.0, tl.float32)
            lo = lo - z[None, :]
            hi = hi - z[None, :]
            if DOT_F32:
                part = tl.dot(x_even.to(tl.float32), lo, input_precision="ieee")
                part += tl.dot(x_odd.to(tl.float32), hi, input_precision="ieee")
            else:
                part = tl.dot(x_even, lo.to(x_even.dtype))
                part += tl.dot(x_odd, hi.to(x_odd.dtype))
            acc += part * s[None, :]
        tl.store(
            y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use the dequantizing path")


def _dense_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x as [M, K] with a stride-1 last dimension (copied only when it has not one)."""
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, {k}], got {tuple(x.shape)}")
    return x if x.stride(1) == 1 or x.shape[1] == 1 else x.contiguous()


def _dot_f32(x: torch.Tensor) -> bool:
    """Multiply tiles in fp32 (IEEE, not tf32) for fp32 activations, and for bf16 under the CPU
    interpreter, whose bf16 `tl.dot` is wrong (numpy has no bf16); GPUs multiply bf16/fp16
    tiles natively."""
    return x.dtype == torch.float32 or (_INTERPRETED and x.dtype == torch.bfloat16)


def _tiles(m: int, n: int) -> tuple[int, int]:
    """(BM, BN): decode-sized M takes the smallest tile tl.dot allows and narrower columns so
    a 4096-wide layer still spreads over every SM; prefill takes wider tiles."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    bn = 32 if m <= 16 and n <= 8192 else 64
    return bm, bn


def w8a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) @ (qweight int8 [N, K] * scale [N, 1])^T -> [M, N], x's dtype."""
    _require_triton()
    n, k = qweight.shape
    if qweight.dtype != torch.int8 or scale.shape != (n,):
        raise ValueError(
            f"w8a16 needs int8 codes [N, K] and scales [N]; got {qweight.dtype} "
            f"{tuple(qweight.shape)} and {tuple(scale.shape)}"
        )
    require_contiguous("w8a16_matmul", qweight=qweight, scale=scale)
    x = _dense_rows(x, k)
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bm, bn = _tiles(m, n)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _w8a16_kernel[grid](
        x, qweight, scale, y, m, n, k, x.stride(0), y.stride(0),
        DOT_F32=_dot_f32(x), BM=bm, BN=bn, BK=64,
    )  # fmt: skip
    return y


def w4a16_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    group: int,
) -> torch.Tensor:
    """x [M, K] @ dequant(pack_int4 codes [N, K/2], scale/zero [N, K/group])^T -> [M, N];
    zero None means symmetric (zero point 8)."""
    _require_triton()
    n, half = packed.shape
    k = 2 * half
    groups = k // group if group else 0
    if (
        packed.dtype != torch.uint8
        or group % W4A16_GROUP_MULTIPLE
        or k % group
        or scale.shape != (n, groups)
    ):
        raise ValueError(
            f"w4a16 needs packed uint8 [N, K/2] with K divisible by the group ({group}, a "
            f"multiple of 32) and scales [N, K/group]; got {tuple(packed.shape)} and "
            f"{tuple(scale.shape)}"
        )
    if zero is not None and zero.shape != scale.shape:
        raise ValueError(f"zero points {tuple(zero.shape)} != scales {tuple(scale.shape)}")
    require_contiguous("w4a16_matmul", packed=packed, scale=scale)
    if zero is not None:
        require_contiguous("w4a16_matmul", zero=zero)
    x = _dense_rows(x, k)
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bm, bn = _tiles(m, n)
    bk = next(b for b in (128, 64, 32) if group % b == 0)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _w4a16_kernel[grid](
        x,
        packed,
        scale,
        zero if zero is not None else scale,
        y,
        m,
        n,
        k,
        x.stride(0),
        y.stride(0),
        GROUP=group,
        HAS_ZERO=zero is not None,
        DOT_F32=_dot_f32(x),
        BM=bm,
        BN=bn,
        BK=bk,
    )
    return y
