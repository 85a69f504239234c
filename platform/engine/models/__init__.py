"""Model architectures; importing this package registers the built-in ones."""

from loraplex.platform.engine.models import (  # noqa: F401  (registration)
    deepseek,
    llama,
    mixtral,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
)
from loraplex.platform.engine.models.registry import (
    UnsupportedArchitectureError,
    register_model,
    resolve_model_class,
    supported_architectures,
)

__all__ = [
    "UnsupportedArchitectureError",
    "register_model",
    "resolve_model_class",
    "supported_architectures",
]
