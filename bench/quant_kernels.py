"""`loraplex bench quant-kernels`: one quantized Linear's matmul, each kernel path the engine can
take on this device, timed against a bf16 `F.linear` of the same shape in the same run.

Shapes: hidden -> hidden and hidden -> intermediate (default 2048 -> 2048 and 2048 -> 5632) at
batch 1 and 32. Paths: int8 and int4 (g128, asymmetric) on the kernel their method picks here
(PyTorch's packed CPU kernels, or the Triton GEMMs on CUDA), and fp8 both ways: weight-only
(dequantize then matmul) and W8A8 `torch._scaled_mm` (where it runs). This is the measurement
behind fp8's choice on CPU (weight-only unless `_scaled_mm` is faster).

RESULT quant_kernels.<path>_<in>x<out>_b<M>_speedup (bf16 ms over the path's ms) and
quant_kernels.bf16_<in>x<out>_b<M>_ms.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from loraplex.bench._gpu_kernel_checks import call_times_ms
from loraplex.loader.quant import Quantizer, resolve_scheme
from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.layers.quant import linear_quantization
from loraplex.platform.engine.layers.quant.fp8 import scaled_mm_supported


def _log(msg: str) -> None:
    print(f"[bench quant-kernels] {msg}", file=sys.stderr, flush=True)


def quantized_linear(choice: str, w: torch.Tensor, device: str) -> Linear:
    """A Linear holding `w` quantized as `choice`, loaded and packed the way the engine does."""
    out_f, in_f = w.shape
    with torch.device(device), linear_quantization(resolve_scheme(choice)):
        layer = Linear(in_f, out_f, bias=False, layer_idx=0, name="o_proj", dtype=torch.bfloat16)
    for name, t in Quantizer(choice).apply("m.o_proj.weight", w):
        layer.load_slice("o_proj", t.to(device), piece=name.rsplit(".", 1)[1])
    layer.finish_loading()
    return layer.requires_grad_(False)


def best_ms(fn: Callable[[], object], device: str, iters: int) -> float:
    """Fastest of `iters` calls of `fn` in milliseconds: the least disturbed run, since a shared
    CPU's scheduler adds whole time slices."""
    return call_times_ms(fn, device, iters)[0]


def paths(w: torch.Tensor, device: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """name -> x -> y for every quantized path of weight `w` on `device`."""
    int8, int4 = quantized_linear("int8", w, device), quantized_linear("int4", w, device)
    fp8 = quantized_linear("fp8", w, device)

    def fp8_path(w8a8: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            fp8.fp8_w8a8 = w8a8  # the fp8 method's own switch on the layer
            return fp8(x)

        return run

    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        f"int8_{int8.quant_kernel}": int8,
        f"int4_{int4.quant_kernel}": int4,
    }
    out["fp8_weight_only"] = fp8_path(False)
    if scaled_mm_supported(torch.device(device)):
        out["fp8_scaled_mm"] = fp8_path(True)
    return out


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    """Time every path against bf16 and print RESULT lines."""
    p = argparse.ArgumentParser(prog="loraplex bench quant-kernels", description=__doc__)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    dev = args.device
    for out_f in (args.hidden, args.intermediate):
        w = torch.randn(out_f, args.hidden, generator=g) / args.hidden**0.5
        dense = w.to(torch.bfloat16).to(dev)
        runs = paths(w, dev)
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, args.hidden, generator=g).to(torch.bfloat16).to(dev)
            shape = f"{args.hidden}x{out_f}_b{m}"
            base = best_ms(functools.partial(F.linear, x, dense), dev, args.iters)
            print(f"RESULT quant_kernels.bf16_{shape}_ms={base:.4g}", flush=True)
            for name, fn in runs.items():
                ms = best_ms(functools.partial(fn, x), dev, args.iters)
                _log(f"{name} {shape}: {ms:.3f} ms (bf16 {base:.3f} ms)")
                print(f"RESULT quant_kernels.{name}_{shape}_speedup={base / ms:.4g}", flush=True)
    return 0
