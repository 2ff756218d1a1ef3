"""A model's weights read on a thread of their own, so a GGUF file repacks while the loading thread
reads the config and tokenizer.

Those take about 2 s of one core (transformers' imports, in Python); the repack runs in C++ without
the GIL and is bound by page faults, so the two overlap. On the Zen 5 VM (2026-12-05, 8B Q4_K_M
file, loads back to back) model construction took a median 3.7 s against 4.5 s reading the weights
after the tokenizer (docs/benchmarks-history.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch

Item = TypeVar("Item")

_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class BackgroundWeights(Iterable[Item]):
    """Runs `produce()` (an iterator of (name, weight) pairs) on a daemon thread from the start,
    queueing what it yields; iterating hands the items over in order, waiting where the thread
    has not reached them yet, and raises the thread's error where it failed. `close()` stops it
    between two items (a load that failed elsewhere), dropping what it made."""

    def __init__(self, produce: Callable[[], Iterator[Item]], threads: int | None = None):
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = threads or torch.get_num_threads()
        self._thread = threading.Thread(
            target=self._run, args=(produce,), name="weights", daemon=True
        )
        self._thread.start()

    def _run(self, produce: Callable[[], Iterator[Item]]) -> None:
        # OpenMP's thread count is per thread: a new one starts from the machine's default
        torch.set_num_threads(self._threads)
        try:
            for item in produce():
                if self._stop.is_set():
                    return
                self._items.put(item)
            self._items.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._items.put(_Failed(exc))

    def __iter__(self) -> Iterator[Item]:
        while True:
            item = self._items.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        """Stop the thread after the item it is making and drop everything it made."""
        self._stop.set()
        self._thread.join()
        while not self._items.empty():
            self._items.get()
