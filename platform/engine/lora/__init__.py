"""The engine side of multi-LoRA serving. `runtime.LoraRuntime` composes: `hooks` (the model's
Linear hooks and the kernel choice), `fetcher` + `sources` (adapter references -> host tier,
on a background thread), `tiers` (host LRU -> device pages), `admission` (which requests join
a step); `metrics` exports it. The engine sees it through `engine.ports.LoraRuntimeProtocol`."""

from loraplex.platform.engine.lora.runtime import AdapterHandle, LoraRuntime
from loraplex.platform.engine.lora.sources import AdapterRef

__all__ = ["AdapterHandle", "AdapterRef", "LoraRuntime"]
