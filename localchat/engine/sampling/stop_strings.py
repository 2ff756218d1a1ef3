"""Stop strings found as a sequence's text grows, in time linear in the new text whatever the number
and length of the stop strings: an Aho-Corasick automaton over a request's stop strings (built once
per set of strings), and a matcher per sequence that keeps its place in it.

The matcher's state is the longest tail of the text that is the start of some stop string: its
length is what the detokenizer holds back from streaming, since those characters may still turn
into a stop string. A scan over p new characters costs O(p) steps plus one per match found, where
trying each stop string at each new position costs O(p x total stop length).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class StopAutomaton:
    """The goto, failure and output links of a set of stop strings (state 0 is the empty text)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        # the lowest index of a stop string that is exactly this state's text, else -1
        self.terminal = [-1]
        for index, stop in enumerate(self.stops):
            state = 0
            for char in stop:
                following = self.goto[state].get(char)
                if following is None:
                    following = len(self.goto)
                    self.goto[state][char] = following
                    self.goto.append({})
                    self.depth.append(self.depth[state] + 1)
                    self.terminal.append(-1)
                state = following
            if self.terminal[state] < 0:
                self.terminal[state] = index
        self.fail = [0] * len(self.goto)
        # the nearest state down the failure chain (itself excluded) that ends a stop string, else 0
        self.output = [0] * len(self.goto)
        queue = deque(self.goto[0].values())
        while queue:
            state = queue.popleft()
            for char, following in self.goto[state].items():
                queue.append(following)
                fallback = self.fail[state]
                while fallback and char not in self.goto[fallback]:
                    fallback = self.fail[fallback]
                target = self.goto[fallback].get(char, 0)
                self.fail[following] = target if target != following else 0
                link = self.fail[following]
                self.output[following] = link if self.terminal[link] >= 0 else self.output[link]

    def step(self, state: int, char: str) -> int:
        """The state after one more character."""
        while state and char not in self.goto[state]:
            state = self.fail[state]
        return self.goto[state].get(char, 0)

    def matches(self, state: int):
        """The stop strings that end at this state: (stop index, its length) each."""
        if self.terminal[state] < 0:
            state = self.output[state]
        while state:
            yield self.terminal[state], self.depth[state]
            state = self.output[state]


@functools.lru_cache(maxsize=64)
def automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """The automaton of these stop strings (a request's n sequences share one)."""
    return StopAutomaton(stops)


@dataclass(frozen=True)
class StopMatch:
    """A stop string found in the text: where it starts, and which one (its index)."""

    start: int
    index: int


class StopMatcher:
    """One sequence's place in its stop strings' automaton, fed the text as it grows."""

    def __init__(self, stops: Sequence[str]):
        self.automaton = automaton(tuple(stops))
        self.state = 0
        self.consumed = 0  # characters fed so far

    @property
    def held(self) -> int:
        """The length of the longest tail of the text so far that a stop string starts with."""
        return self.automaton.depth[self.state]

    def feed(self, text: str) -> StopMatch | None:
        """Feed the text's next characters. The stop string that ends within them and starts first
        (the lowest index among those starting at the same place), if any; the matcher is then
        spent (the sequence stops)."""
        found: StopMatch | None = None
        automaton, state = self.automaton, self.state
        for offset, char in enumerate(text):
            state = automaton.step(state, char)
            if automaton.terminal[state] < 0 and not automaton.output[state]:
                continue
            end = self.consumed + offset + 1
            for index, length in automaton.matches(state):
                match = StopMatch(end - length, index)
                if found is None or (match.start, match.index) < (found.start, found.index):
                    found = match
        self.state = state
        self.consumed += len(text)
        return found
