"""Shared test helpers, one package (`from support.<module> import ...`; `tests/` is on the
path through the root conftest): control-plane and gateway stacks, uploads, the engine's
paged-attention harness, LoRA references, scripted replicas, the import-contract runner.
Random models and adapters come from `loraplex.bench._synthetic` (benchmarks use them too).
"""
