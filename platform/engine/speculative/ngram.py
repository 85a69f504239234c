"""Prompt lookup: an incremental n-gram index over a token stream that proposes the tokens
that followed the latest earlier occurrence of the stream's last n tokens.

Each appended token costs O(ngram sizes) dict updates and a lookup O(sizes), so proposing for
a whole batch every step stays far below the step's own cost.
"""

from __future__ import annotations

SEPARATOR = -1  # never a token id: n-grams and continuations stop at it


class NgramIndex:
    """n-gram (for each n in [n_min, n_max]) -> the end of its latest occurrence that has a
    token after it, over `tokens` (appended to, never edited)."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # end positions < this are in `_ends`

    def extend(self, tokens: list[int]) -> None:
        """Append tokens and index every n-gram that now has a continuation."""
        self.tokens.extend(tokens)
        toks, ends = self.tokens, self._ends
        for end in range(max(self._indexed, 1), len(toks)):
            if toks[end] == SEPARATOR:
                continue
            for n in range(self.n_min, min(self.n_max, end) + 1):
                gram = tuple(toks[end - n : end])
                if SEPARATOR in gram:
                    break
                ends[gram] = end
        self._indexed = max(self._indexed, len(toks))

    def propose(self, suffix: list[int], k: int, own: bool) -> list[int]:
        """Up to `k` tokens that followed the latest occurrence of the longest matching tail of
        `suffix`. `own`: the suffix is this index's own stream, so a match running into the
        stream's end continues through the draft itself (a loop of period p repeats)."""
        toks, ends = self.tokens, self._ends
        for n in range(min(self.n_max, len(suffix)), self.n_min - 1, -1):
            end = ends.get(tuple(suffix[len(suffix) - n :]))
            if end is None:
                continue
            out: list[int] = []
            for pos in range(end, end + k):
                if pos < len(toks):
                    tok = toks[pos]
                elif own:
                    tok = out[pos - len(toks)]
                else:
                    break
                if tok == SEPARATOR:
                    break
                out.append(tok)
            return out
        return []
