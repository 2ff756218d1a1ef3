"""Run one request while token streams decode, noting when each stream's tokens arrived and when
the request was sent and answered (the embedding tests: is a request computed beside the
decodes, or only once they are done?)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class BesideStreams(Generic[T]):
    result: T
    streams: list[list[float]]  # each stream's token arrival times
    start: float
    end: float  # when the request was sent and answered


def beside_streams(
    count: int, stream: Callable[[int, list[float]], None], request: Callable[[], T]
) -> BesideStreams[T]:
    """Start `count` threads running stream(i, times) (appending each token's arrival time), run
    `request` once every stream is decoding, then wait for the streams to end."""
    streams: list[list[float]] = [[] for _ in range(count)]
    threads = [threading.Thread(target=stream, args=(i, t)) for i, t in enumerate(streams)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while not all(len(times) >= 2 for times in streams):  # every stream is decoding
        assert time.monotonic() < deadline, [len(t) for t in streams]
        time.sleep(0.01)
    start = time.monotonic()
    result = request()
    end = time.monotonic()
    for thread in threads:
        thread.join(timeout=120)
    return BesideStreams(result, streams, start, end)
