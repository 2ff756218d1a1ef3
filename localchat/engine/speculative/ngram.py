"""Prompt lookup (vLLM's `ngram` method): the tokens that followed an earlier occurrence of the
n-gram that ends a sequence, n from the longest allowed down to the shortest.

Of several occurrences the one the last draft came from is kept while the sequence still follows it
(the text being copied, as when a file is returned with one change), else the latest one."""

from __future__ import annotations


class NgramIndex:
    """Where each n-gram of one token list (n in [min_n, max_n]) last ended, kept up to date as
    tokens are appended (each token is indexed once; a lookup costs a dict probe per n)."""

    __slots__ = ("_anchor", "_ends", "_indexed", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at positions < this are in _ends
        # (where the last draft was taken from, the list's length then)
        self._anchor: tuple[int, int] | None = None

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed an earlier occurrence of the longest n-gram that ends
        `tokens` (the list this index has seen grow; it must only ever have been appended to);
        [] where none recurs."""
        end = len(tokens)
        # index every n-gram that ends before the last token: the one ending at `end` is the
        # suffix being looked up, which must not find itself
        for stop in range(max(self._indexed, 1), end):
            for n, table in self._ends.items():
                if stop >= n:
                    table[tuple(tokens[stop - n : stop])] = stop
        self._indexed = max(self._indexed, end)
        found = self._followed(tokens)
        if found is None:
            for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
                found = self._ends[n].get(tuple(tokens[end - n :]))
                if found is not None:
                    break
        if found is None:
            self._anchor = None
            return []
        self._anchor = (found, end)
        return tokens[found : found + k]

    def _followed(self, tokens: list[int]) -> int | None:
        """Where the last draft's source continues, if the sequence has kept to it since (its last
        max_n tokens equal the source's at the same offset)."""
        if self._anchor is None:
            return None
        source, then = self._anchor
        found = source + len(tokens) - then
        n = min(self.max_n, found)
        if found >= len(tokens) or n < self.min_n:
            return None
        return found if tokens[found - n : found] == tokens[len(tokens) - n :] else None
