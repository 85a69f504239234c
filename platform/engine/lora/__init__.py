"""The engine side of multi-LoRA serving: the runtime that hooks the model's Linear modules,
the adapter-aware admission policy, and adapter sources (directories, object storage)."""

from loraplex.platform.engine.lora.runtime import AdapterHandle, LoraRuntime
from loraplex.platform.engine.lora.sources import AdapterRef

__all__ = ["AdapterHandle", "AdapterRef", "LoraRuntime"]
