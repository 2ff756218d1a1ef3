"""How many tokens to draft for one sequence next, from how its drafts fared: a run of drafts
that is accepted whole lengthens the next one, a rejection shortens it to what was accepted plus
one, and drafts rejected at their first token several times running pause drafting for a number of
steps that doubles each time (up to MAX_PAUSE), so open-ended text, where lookups rarely hit, pays
almost nothing for the guesses."""

from __future__ import annotations

MAX_PAUSE = 64  # steps without drafting after repeated misses, at most
MISSES_BEFORE_PAUSE = 2


class DraftLength:
    """One sequence's adaptive draft length (fixed at `limit` when not adaptive)."""

    __slots__ = ("adaptive", "current", "limit", "misses", "pause")

    def __init__(self, limit: int, adaptive: bool = True) -> None:
        self.limit = limit
        self.adaptive = adaptive
        self.current = limit
        self.misses = 0  # drafts in a row rejected at their first token
        self.pause = 0  # steps left without drafting

    def next(self) -> int:
        """The length of the next draft (0: don't draft this step)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.current

    def record(self, drafted: int, accepted: int) -> None:
        """A verified draft of `drafted` tokens of which the first `accepted` were right."""
        if not self.adaptive or drafted == 0:
            return
        if accepted == drafted:
            self.current = min(self.limit, self.current + 2)
        else:
            self.current = max(1, accepted + 1)
        if accepted == 0:
            self.misses += 1
            if self.misses >= MISSES_BEFORE_PAUSE:
                self.pause = min(MAX_PAUSE, 2 ** (self.misses - MISSES_BEFORE_PAUSE + 1))
        else:
            self.misses = 0
