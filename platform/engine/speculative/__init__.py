"""Speculative decoding: proposers (prompt lookup, per-adapter suffix tables), the verification
rule, the K controller, and the `Speculator` that plans each step's drafts and rolls them back.

Verification runs in the target's own forward: each speculating request's drafts ride after its
known tokens, every row is sampled by the engine's `Sampler` (so temperature, top-k/p, min-p,
penalties, `logit_bias` and seeds apply unchanged), and the accepted prefix is kept.
"""

from loraplex.platform.engine.speculative.config import SpecConfig

__all__ = ["SpecConfig"]
