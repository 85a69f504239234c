"""Per-adapter suffix tables: the outputs of an adapter's finished requests, indexed so a new
request of the same adapter can draft from what that adapter tends to write."""

from __future__ import annotations

from collections import OrderedDict

from loraplex.platform.engine.speculative.ngram import SEPARATOR, NgramIndex


class AdapterTables:
    """One bounded n-gram index per adapter key (None: the base model), least recently used
    adapters dropped first past `max_adapters`; an index past `max_tokens` keeps its newer
    half."""

    def __init__(self, n_min: int, n_max: int, max_tokens: int, max_adapters: int = 256) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.max_tokens, self.max_adapters = max_tokens, max_adapters
        self._tables: OrderedDict[str | None, NgramIndex] = OrderedDict()

    def add_output(self, adapter_key: str | None, output: list[int]) -> None:
        """Index one finished request's output under its adapter."""
        if not output:
            return
        table = self._tables.pop(adapter_key, None) or NgramIndex(self.n_min, self.n_max)
        if len(table.tokens) + len(output) + 1 > self.max_tokens:
            kept = table.tokens[len(table.tokens) // 2 :]
            table = NgramIndex(self.n_min, self.n_max)
            table.extend(kept[-self.max_tokens // 2 :])
        table.extend([*output[-self.max_tokens // 2 :], SEPARATOR])
        self._tables[adapter_key] = table
        while len(self._tables) > self.max_adapters:
            self._tables.popitem(last=False)

    def propose(self, adapter_key: str | None, suffix: list[int], k: int) -> list[int]:
        """Up to `k` tokens the adapter wrote after `suffix`'s tail before; [] when unknown."""
        table = self._tables.get(adapter_key)
        if table is None:
            return []
        return table.propose(suffix, k, own=False)

    def num_tokens(self, adapter_key: str | None) -> int:
        """Tokens held for this adapter (separators included)."""
        table = self._tables.get(adapter_key)
        return 0 if table is None else len(table.tokens)
