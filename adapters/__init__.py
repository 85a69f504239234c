"""LoRA adapters: the PEFT format, loading and validation, the host and device caches,
per-step batch metadata and the batched shrink/expand kernels (torch and Triton)."""
