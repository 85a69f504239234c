"""The data-plane engine: continuous batching, paged KV cache, prefix caching, chunked prefill.

`from loraplex.platform.engine import LLM, SamplingParams` is the offline API; the parts
(scheduler, KV cache manager, model runner, sampler) are described in README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loraplex.platform.engine.outputs import CompletionOutput, RequestDelta, RequestOutput
from loraplex.platform.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from loraplex.platform.engine.engine_core import EngineCore
    from loraplex.platform.engine.llm import LLM
    from loraplex.platform.engine_spec.config import EngineConfig

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "EngineCore",
    "RequestDelta",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    """Import the heavy parts (model code, torch) only when first used."""
    if name == "LLM":
        from loraplex.platform.engine.llm import LLM

        return LLM
    if name == "EngineCore":
        from loraplex.platform.engine.engine_core import EngineCore

        return EngineCore
    if name == "EngineConfig":
        from loraplex.platform.engine_spec.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
