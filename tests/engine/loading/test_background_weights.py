"""Weights read on a thread of their own while the config and tokenizer load."""

from __future__ import annotations

import threading
import time

import pytest

from localchat import LLM, SamplingParams
from localchat.engine.core import runtime
from localchat.engine.loading.background_weights import BackgroundWeights


def test_items_come_in_order_and_the_thread_ends():
    weights = BackgroundWeights(lambda: iter([("a", 1), ("b", 2), ("c", 3)]))
    assert list(weights) == [("a", 1), ("b", 2), ("c", 3)]
    weights.close()


def test_the_threads_error_is_raised_where_the_items_are_taken():
    def produce():
        yield "first", 1
        raise ValueError("tensor 2 is damaged")

    items = iter(BackgroundWeights(produce))
    assert next(items) == ("first", 1)
    with pytest.raises(ValueError, match="tensor 2 is damaged"):
        next(items)


def test_close_stops_the_thread_between_two_items():
    made: list[int] = []
    release = threading.Event()

    def produce():
        for i in range(200):
            made.append(i)
            yield str(i), i
            release.wait(30)  # after item 0: until close() has asked the thread to stop

    weights = BackgroundWeights(produce)
    assert next(iter(weights)) == ("0", 0)
    closing = threading.Thread(target=weights.close)
    closing.start()
    deadline = time.monotonic() + 30
    while not weights._stop.is_set():  # close() has asked; now it waits for the thread
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release.set()
    closing.join(30)
    # the thread finished the item it was making (1), then stopped: not one of the other 198
    assert made == [0, 1] and not closing.is_alive()
    assert not any(t.name == "weights" and t.is_alive() for t in threading.enumerate())


def test_a_gguf_model_repacks_its_weights_while_its_tokenizer_loads(
    default_gguf, float_llm, monkeypatch
):
    started: list[BackgroundWeights] = []

    class Recorded(BackgroundWeights):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(runtime, "BackgroundWeights", Recorded)
    llm = LLM(str(default_gguf), max_model_len=256, kv_cache_memory="16MiB")
    assert len(started) == 1
    # the weights it took as they came are the file's: it answers as the float32 path does (which
    # test_parity.py holds against transformers), as the default model does
    params = SamplingParams(temperature=0, max_tokens=24)
    chat = [{"role": "user", "content": "Name three rivers in Europe."}]
    assert llm.chat(chat, params)[0].token_ids == float_llm.chat(chat, params)[0].token_ids
    # a dummy load has nothing to read in the background
    started.clear()
    LLM(str(default_gguf), load_format="dummy", max_model_len=256, kv_cache_memory="16MiB")
    assert started == []
