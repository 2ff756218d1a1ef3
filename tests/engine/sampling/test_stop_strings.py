"""The stop-string automaton against the naive search it replaces (every stop string tried at every
new position of the whole text), on random stop strings and texts cut into random chunks: the same
stop found at the same place, and the same tail held back after every chunk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.sampling.stop_strings import StopAutomaton, StopMatcher

ALPHABET = "ab€"  # few letters, so stop strings overlap and share prefixes often
stops_strategy = st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=1, max_size=6)
chunks_strategy = st.lists(st.text(ALPHABET, max_size=5), max_size=25)


def naive_find(text: str, new_start: int, stops: list[str]) -> tuple[int, int] | None:
    """(start, index) of the first-starting stop string that ends at or after new_start."""
    best = None
    for index, stop in enumerate(stops):
        start = text.find(stop, max(0, new_start - len(stop) + 1))
        if start >= 0 and (best is None or start < best[0]):
            best = (start, index)
    return best


def naive_held(text: str, stops: list[str]) -> int:
    """The longest tail of the text that is a proper prefix of some stop string."""
    return max(
        (size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
        default=0,
    )


@settings(max_examples=400, deadline=None)
@given(stops=stops_strategy, chunks=chunks_strategy)
def test_the_automaton_finds_what_the_naive_search_finds(stops, chunks):
    matcher = StopMatcher(stops)
    text = ""
    for chunk in chunks:
        new_start = len(text)
        text += chunk
        found = matcher.feed(chunk)
        expected = naive_find(text, new_start, stops)
        assert (found.start, found.index) == expected if found else expected is None
        if found:
            return
        assert matcher.held == naive_held(text, stops)


def test_a_text_made_of_one_stop_strings_prefixes_is_scanned_once():
    """'aaa...b' stop strings over a text of a's: each character takes a bounded number of
    automaton moves (the failure links are walked at most once per character, amortized)."""
    stops = ["a" * 200 + "b" + str(i) for i in range(50)]
    automaton = StopAutomaton(stops)
    moves = 0
    step = automaton.step

    def counting_step(state: int, char: str) -> int:
        nonlocal moves
        before = state
        after = step(state, char)
        moves += 1 + max(0, automaton.depth[before] + 1 - automaton.depth[after])
        return after

    automaton.step = counting_step  # type: ignore[method-assign]
    matcher = StopMatcher.__new__(StopMatcher)
    matcher.automaton, matcher.state, matcher.consumed = automaton, 0, 0
    text = "a" * 5000 + "b0"
    for i in range(0, len(text), 7):
        found = matcher.feed(text[i : i + 7])
    assert found is not None and found.index == 0 and found.start == 5000 - 200
    assert moves <= 3 * len(text)  # the naive search tried 50 strings of 202 at each position
    prefixes = {stop[:size] for stop in stops for size in range(1, len(stop) + 1)}
    assert len(automaton.goto) == 1 + len(prefixes)  # the shared prefix is stored once
