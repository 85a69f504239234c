"""The quantized-linear seam: the method protocol and the scheme a model is being built with."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import torch

from loraplex.loader.quant.schemes import QuantScheme

if TYPE_CHECKING:
    from loraplex.platform.engine.layers.linear import Linear

_SCHEME: contextvars.ContextVar[QuantScheme | None] = contextvars.ContextVar(
    "linear_quant_scheme", default=None
)


@contextlib.contextmanager
def linear_quantization(scheme: QuantScheme | None) -> Iterator[None]:
    """Linears constructed inside this block store their weights as `scheme` says."""
    token = _SCHEME.set(scheme if scheme is not None and scheme.quantizes_linears else None)
    try:
        yield
    finally:
        _SCHEME.reset(token)


def current_linear_scheme() -> QuantScheme | None:
    """The scheme Linears built now use (None: plain float weights)."""
    return _SCHEME.get()


class QuantMethod(Protocol):
    """How one quantized Linear stores its weight and multiplies by it."""

    scheme: QuantScheme

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        """Register the (empty) tensors the checkpoint loads into, rows = output channels."""

    def finish_loading(self, layer: Linear) -> None:
        """Repack the loaded tensors into the kernel's layout."""

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> x @ W^T (+ bias) [..., out] in x's dtype."""


def make_quant_method(scheme: QuantScheme) -> QuantMethod:
    """The method serving `scheme`'s linear weights."""
    from loraplex.platform.engine.layers.quant.fp8 import Fp8Method
    from loraplex.platform.engine.layers.quant.int4 import Int4Method
    from loraplex.platform.engine.layers.quant.int8 import Int8Method

    methods: dict[str, Callable[[QuantScheme], QuantMethod]] = {
        "int8": Int8Method,
        "int4": Int4Method,
        "fp8": Fp8Method,
    }
    if scheme.kind not in methods:
        raise ValueError(f"{scheme.name!r} stores no quantized linear weights")
    return methods[scheme.kind](scheme)


def frozen(t: torch.Tensor) -> torch.nn.Parameter:
    """A parameter that never needs a gradient (quantized codes and scales)."""
    return torch.nn.Parameter(t, requires_grad=False)


def add_bias(y: torch.Tensor, layer: Linear) -> torch.Tensor:
    """y + bias, when the layer has one."""
    return y if layer.bias is None else y + layer.bias
