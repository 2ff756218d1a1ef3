"""Suffix decoding (vLLM's `suffix` method, after Arctic's): drafts from a suffix tree, cut to a
depth, over the request's own tokens and over recent requests' outputs.

Every window of up to `depth` tokens of a text is a path in a trie whose nodes count how often
they were passed. The longest suffix of the sequence found in a trie is followed along its most
frequent children while each child keeps at least `min_token_prob` of its parent's count, for at
most `max_spec_factor` times the match's length (a long match earns a long draft). The request's own
trie (prompt and output) and the shared trie of recent outputs each propose; the longer draft wins.
"""

from __future__ import annotations

from collections import OrderedDict


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class SuffixTrie:
    """Windows of up to `depth` tokens of the texts added, with their counts."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()

    def add(self, tokens: list[int], start: int = 0, sign: int = 1) -> None:
        """Count (sign -1: uncount) the windows of `tokens` that start at `start` or later."""
        for first in range(start, len(tokens)):
            node = self.root
            for token in tokens[first : first + self.depth]:
                child = node.children.get(token)
                if child is None:
                    if sign < 0:
                        break
                    child = node.children[token] = _Node()
                child.count += sign
                if child.count <= 0:
                    del node.children[token]
                    break
                node = child

    def extend(self, tokens: list[int], old_length: int) -> None:
        """Count what appending tokens[old_length:] adds: each window that now reaches further."""
        for first in range(max(0, old_length - self.depth + 1), len(tokens)):
            node = self.root
            for offset, token in enumerate(tokens[first : first + self.depth]):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                if first + offset >= old_length:  # a step this window had not taken yet
                    child.count += 1
                node = child

    def match(self, tokens: list[int]) -> tuple[_Node | None, int]:
        """The node of the longest suffix of `tokens` in the trie that has a continuation, and its
        length (a trie holding `tokens` itself has their own last window too, which ends there and
        adds no continuation)."""
        for length in range(min(self.depth - 1, len(tokens)), 0, -1):
            node: _Node | None = self.root
            for token in tokens[len(tokens) - length :]:
                node = node.children.get(token) if node is not None else None
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return None, 0

    @staticmethod
    def follow(node: _Node, limit: int, min_prob: float) -> list[int]:
        """The most frequent path below `node`, at most `limit` tokens, while each step keeps at
        least `min_prob` of the count before it."""
        draft: list[int] = []
        while len(draft) < limit and node.children:
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            if child.count < min_prob * max(node.count, 1):
                break
            draft.append(token)
            node = child
        return draft


MAX_CACHED_TOKENS = 8192  # the shared trie's outputs, at most, so its nodes stay few (~depth each)
MAX_OWN_TOKENS = 4096  # a request's own trie indexes its last this many tokens


class SuffixCache:
    """The shared trie over the outputs of the last `max_requests` finished requests (and at most
    MAX_CACHED_TOKENS of them)."""

    def __init__(self, depth: int, max_requests: int) -> None:
        self.trie = SuffixTrie(depth)
        self.max_requests = max_requests
        self._outputs: OrderedDict[int, list[int]] = OrderedDict()
        self._tokens = 0

    def add_output(self, key: int, tokens: list[int]) -> None:
        tokens = list(tokens[-MAX_CACHED_TOKENS:])
        if self.max_requests <= 0 or not tokens or key in self._outputs:
            return
        self._outputs[key] = tokens
        self._tokens += len(tokens)
        self.trie.add(tokens)
        while len(self._outputs) > self.max_requests or self._tokens > MAX_CACHED_TOKENS:
            _, old = self._outputs.popitem(last=False)
            self._tokens -= len(old)
            self.trie.add(old, sign=-1)


class SuffixDrafter:
    """One sequence's suffix drafts: its own trie, kept up to date, and the shared cache's."""

    __slots__ = ("_length", "cache", "factor", "min_prob", "own")

    def __init__(self, cache: SuffixCache, factor: float, min_prob: float) -> None:
        self.cache = cache
        self.own = SuffixTrie(cache.trie.depth)
        self.factor = factor
        self.min_prob = min_prob
        self._length = 0

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens to follow `tokens` (the list this drafter has seen grow)."""
        if self._length == 0:  # first call: a long prompt is indexed from its last tokens on
            self.own.add(tokens, start=max(0, len(tokens) - MAX_OWN_TOKENS))
        else:
            self.own.extend(tokens, self._length)
        self._length = len(tokens)
        best: list[int] = []
        for trie in (self.own, self.cache.trie):
            node, length = trie.match(tokens)
            if node is None:
                continue
            limit = min(k, max(1, int(self.factor * length)))
            draft = SuffixTrie.follow(node, limit, self.min_prob)
            if len(draft) > len(best):
                best = draft
        return best
