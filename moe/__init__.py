"""Mixture-of-experts layers: gating, token-expert alignment, grouped expert kernels (torch
on CPU, Triton on GPU; float or int8 / int4 / fp8 expert stacks), the MoE block the engine's
decoder layers use, expert parallelism (placement, all-to-all dispatch, rank launch) and EPLB
load balancing.

Depends only on torch/triton, `loader.quant` (the quantization formats) and prometheus_client
(the balancedness gauge); the engine (`loraplex.platform.engine`) imports this package, never
the other way round.
"""
