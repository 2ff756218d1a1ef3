"""How long token streams wait while an embedding request is computed beside them, on a running
server (single engine or data-parallel): the longest gap between two of a stream's tokens while the
request ran, as a share of the request's time. Run between steps, the request would stall a stream
for all of it (about 1.0); prefilled in the scheduler's steps next to the decodes, for about a step
(a third, with three steps' worth of input). The tests assert the scheduling by the engine's own
batches (tests/engine/core/test_embeddings.py); this measures what a client sees, which depends on
the machine.

    python benchmarks/embeddings_beside_streams.py URL [--streams 3] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time

import httpx


def stream_times(url: str, headers: dict, prompt: str, times: list[float]) -> None:
    body = {"prompt": prompt, "max_tokens": 120, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=300
    ) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.monotonic())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    inputs = [" ".join(f"item{i}-{j}" for j in range(70)) for i in range(4)]  # ~1400 tokens
    streams: list[list[float]] = [[] for _ in range(args.streams)]
    threads = [
        threading.Thread(target=stream_times, args=(url, headers, f"Story {i}:", times))
        for i, times in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    while not all(len(times) >= 2 for times in streams):  # every stream is decoding
        time.sleep(0.01)
    start = time.monotonic()
    reply = httpx.post(f"{url}/v1/embeddings", json={"input": inputs}, headers=headers, timeout=300)
    end = time.monotonic()
    reply.raise_for_status()
    for thread in threads:
        thread.join()
    for index, times in enumerate(streams):
        inside = [start, *(t for t in times if start < t < end), end]
        gap = max(b - a for a, b in itertools.pairwise(inside))
        print(
            f"stream {index}: longest wait {gap * 1000:.0f} ms of the embeddings' "
            f"{(end - start) * 1000:.0f} ms ({gap / (end - start):.2f})"
        )


if __name__ == "__main__":
    main()
