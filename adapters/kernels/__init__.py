"""Batched multi-LoRA shrink/expand kernels: the torch path (CPU) and Triton (GPU)."""
