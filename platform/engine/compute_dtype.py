"""The engine's compute dtype when asked for "auto": 16-bit where the hardware computes it natively.

bf16 on a CPU without native bf16 (no AVX512_BF16, no AMX) is emulated through fp32 and is
slower than fp32 itself, so "auto" takes bf16 only where it pays: CUDA devices with bf16
(fp16 on older ones), CPUs whose flags show `avx512_bf16` or `amx_bf16`. Otherwise fp32.
The choice and its reason are reported (`/state`, bench output).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class ComputeDtype:
    """The chosen dtype and why (one line, for logs and /state)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        """ "float32", "bfloat16" or "float16"."""
        return str(self.dtype).removeprefix("torch.")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_native_bf16(flags: set[str] | None = None) -> bool:
    """Does this CPU compute bf16 natively (AVX512_BF16 or AMX)?"""
    flags = cpu_flags() if flags is None else flags
    if any(f in flags for f in CPU_BF16_FLAGS):
        return True
    return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX")


def auto_compute_dtype(device: str | torch.device, flags: set[str] | None = None) -> ComputeDtype:
    """The dtype "auto" means on `device` (see the module docstring)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return ComputeDtype(torch.bfloat16, "CUDA device with bf16")
        return ComputeDtype(torch.float16, "CUDA device without bf16")
    if dev.type == "cpu" and cpu_native_bf16(flags):
        return ComputeDtype(torch.bfloat16, "CPU has native bf16 (AVX512_BF16/AMX)")
    return ComputeDtype(torch.float32, f"{dev.type} without native bf16: fp32 is faster")
