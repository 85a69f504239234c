"""GrammarCompiler: the replica's tokenizer as llguidance sees it, and compiled grammars
cached by content (a second request with the same schema copies the compiled matcher)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from loraplex.platform.engine.structured.spec import GrammarSpec
from loraplex.platform.engine.structured.state import GrammarState

CACHE_SIZE = 256


class GrammarCompiler:
    """Compiles `GrammarSpec`s for one tokenizer and vocabulary width (the logits' width)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._lltok: Any | None = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.last_compile_s = 0.0
        self.last_was_cached = False

    def _tokenizer(self) -> Any:
        """The llguidance tokenizer, built on first use (~0.5 s at a 128k vocabulary)."""
        if self._lltok is None:
            from llguidance import LLTokenizer

            eos: int | list[int] | None = self._eos or None
            self._lltok = LLTokenizer(self._tokenizer_json, n_vocab=self.vocab_size, eos_token=eos)
        return self._lltok

    def state_for(self, spec: GrammarSpec) -> GrammarState:
        """A fresh matcher for `spec` (compiled once per content; raises ValueError when the
        grammar or schema is invalid or uses something llguidance does not implement)."""
        from llguidance import LLMatcher

        start = time.perf_counter()
        key = spec.key
        with self._lock:
            proto = self._cache.get(key)
            if proto is not None:
                self._cache.move_to_end(key)
        self.last_was_cached = proto is not None
        if proto is None:
            matcher = LLMatcher(self._tokenizer(), spec.grammar(), log_level=0)
            if matcher.is_error():
                raise ValueError(f"invalid {spec.kind} constraint: {matcher.get_error()}")
            with self._lock:
                self._cache[key] = matcher
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            proto = matcher
        state = GrammarState(proto.deep_copy(), key)
        self.last_compile_s = time.perf_counter() - start
        return state
