"""Structured outputs on the replica: grammar specs compiled with llguidance (cached by
content), one matcher per request beside its sampling state, and the next-token bitmask
filled on a worker thread while the step's forward runs.

- `spec.py`: `GrammarSpec` (what the wire's `StructuredOutput` asks for) -> llguidance grammar.
- `compiler.py`: `GrammarCompiler`: the tokenizer as llguidance sees it, compiled grammars
  cached by content, a fresh `GrammarState` per request.
- `state.py`: `GrammarState`: one request's matcher; advances only on accepted output tokens.
- `bitmask.py`: `MaskFiller` (fills the step's masks on a long-lived worker thread) and
  `apply_bitmask` (the C kernel `bitmask_cpu.c`, or torch where it cannot be built).
"""

from loraplex.platform.engine.structured.spec import GrammarSpec

__all__ = ["GrammarSpec"]
