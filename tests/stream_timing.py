"""Run one request while token streams decode, noting when each stream's tokens arrived and when
the request was sent and answered (the embedding tests: is a request computed beside the
decodes, or only once they are done?). Each stream hangs up a few tokens after the answer, so it
outlasts the request on a slow host without the test waiting for all of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Answered:
    """When the request beside the streams was answered (None until it is)."""

    at: float | None = None

    def hang_up(self, times: list[float], after: int = 3) -> bool:
        """Whether a stream with these token arrival times has had `after` tokens since then."""
        at = self.at
        return at is not None and sum(t > at for t in times) >= after


@dataclass
class BesideStreams(Generic[T]):
    result: T
    streams: list[list[float]]  # each stream's token arrival times
    start: float
    end: float  # when the request was sent and answered


def beside_streams(
    count: int,
    stream: Callable[[int, list[float], Answered], None],
    request: Callable[[], T],
) -> BesideStreams[T]:
    """Start `count` threads running stream(i, times, answered) (appending each token's arrival
    time, and ending once answered.hang_up(times)), run `request` once every stream is decoding,
    then wait for the streams to end."""
    streams: list[list[float]] = [[] for _ in range(count)]
    answered = Answered()
    threads = [
        threading.Thread(target=stream, args=(i, t, answered)) for i, t in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while not all(len(times) >= 2 for times in streams):  # every stream is decoding
        assert time.monotonic() < deadline, [len(t) for t in streams]
        time.sleep(0.01)
    start = time.monotonic()
    try:
        result = request()
    finally:
        end = answered.at = time.monotonic()
    for thread in threads:
        thread.join(timeout=120)
    return BesideStreams(result, streams, start, end)
