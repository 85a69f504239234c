"""Architecture registry: `config.architectures` names -> model classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from loraplex.platform.engine.models.causal_lm import CausalLM

T = TypeVar("T", bound=type[CausalLM])

_REGISTRY: dict[str, type[CausalLM]] = {}


class UnsupportedArchitectureError(ValueError):
    """The config names no architecture this engine implements."""


def register_model(*names: str) -> Callable[[T], T]:
    """Class decorator: serve HF configs whose `architectures` contains any of `names`."""

    def wrap(cls: T) -> T:
        for name in names:
            _REGISTRY[name] = cls
        return cls

    return wrap


def supported_architectures() -> list[str]:
    """The architecture names currently registered, sorted."""
    _ensure_builtin()
    return sorted(_REGISTRY)


def resolve_model_class(hf_config: dict[str, Any]) -> type[CausalLM]:
    """The class for the first supported name in `hf_config["architectures"]`."""
    _ensure_builtin()
    archs = hf_config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    for arch in archs:
        if arch in _REGISTRY:
            return _REGISTRY[arch]
    raise UnsupportedArchitectureError(
        f"unsupported model architecture {archs or '(none given in config.json)'}; "
        f"supported: {', '.join(sorted(_REGISTRY))}"
    )


def _ensure_builtin() -> None:
    """Import the built-in architectures so they are registered even if only this module was."""
    import loraplex.platform.engine.models  # noqa: F401
