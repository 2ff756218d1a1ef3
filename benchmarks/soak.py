"""Soak test: many clients against one `localchat serve` on 127.0.0.1, reporting the server's RSS
over time.

Each client loops until the time or request budget is spent, cycling through full streams, streams
dropped after a few chunks, whole completions, malformed requests and /tokenize calls. Every
`--every` seconds a line gives the server's RSS and the requests done. At the end, requests still
running get `--grace` seconds, then are cut (counted apart, not as errors); the RSS at ready, the
peak and the last, and the error count are printed. It stops by itself.

    # 64 clients, 10 minutes, its own server (default model)
    python benchmarks/soak.py
    # args after -- go to serve
    python benchmarks/soak.py --duration 180 --clients 64 -- --max-num-seqs 64
    # an already running server
    python benchmarks/soak.py --url http://127.0.0.1:8000 --pid 1234
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINDS = ("stream", "dropped", "completion", "malformed", "tokenize")
TOPICS = [
    "the sea",
    "a red fox",
    "paging in operating systems",
    "bread",
    "the moon",
    "trains",
    "tea",
    "rain",
]


@dataclass
class Counts:
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.done.values())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _chat_body(rng: random.Random, stream: bool) -> dict:
    words = " and ".join(rng.choice(TOPICS) for _ in range(rng.randint(1, 8)))
    return {
        "messages": [{"role": "user", "content": f"Write about {words}."}],
        "stream": stream,
        "max_tokens": rng.randint(8, 64),
        "temperature": rng.choice([0, 0.7, 1.0]),
        "seed": rng.randint(0, 9),
    }


async def _one(client: httpx.AsyncClient, kind: str, rng: random.Random) -> None:
    if kind in ("stream", "dropped"):
        keep = 10**9 if kind == "stream" else rng.randint(1, 4)
        async with client.stream(
            "POST", "/v1/chat/completions", json=_chat_body(rng, True)
        ) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{kind}: HTTP {response.status_code}")
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen >= keep or line == "data: [DONE]":
                        break
            if kind == "stream" and line != "data: [DONE]":
                raise RuntimeError("stream ended without [DONE]")
    elif kind == "completion":
        body = {
            "prompt": f"Once upon a time, {rng.choice(TOPICS)}",
            "max_tokens": rng.randint(4, 64),
            "logprobs": rng.choice([None, 2]),
        }
        response = await client.post("/v1/completions", json=body)
        if response.status_code != 200 or not response.json()["choices"]:
            raise RuntimeError(f"completion: HTTP {response.status_code}")
    elif kind == "malformed":
        bad = rng.choice(
            [
                b"{not json",
                json.dumps({"messages": []}).encode(),
                json.dumps({"prompt": "x", "temperature": -3}).encode(),
                json.dumps({"prompt": [10**9]}).encode(),
            ]
        )
        response = await client.post(
            "/v1/completions", content=bad, headers={"content-type": "application/json"}
        )
        if response.status_code != 400:
            raise RuntimeError(f"malformed: HTTP {response.status_code}, expected 400")
    else:
        response = await client.post(
            "/tokenize", json={"prompt": " ".join(TOPICS * rng.randint(1, 20))}
        )
        if response.status_code != 200:
            raise RuntimeError(f"tokenize: HTTP {response.status_code}")


async def _client(
    index: int, base_url: str, deadline: float, budget: list[int], counts: Counts
) -> None:
    rng = random.Random(index)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=None
    ) as client:  # a slow answer is no error
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            kind = KINDS[rng.randrange(len(KINDS))]
            try:
                await _one(client, kind, rng)
                counts.done[kind] += 1
            except Exception as exc:  # counted and shown, the soak goes on
                counts.errors.append(f"{type(exc).__name__}: {exc}")


async def soak(
    base_url: str,
    pid: int,
    clients: int,
    duration: float,
    max_requests: int,
    every: float,
    grace: float,
) -> int:
    counts, budget = Counts(), [max_requests]
    start = time.monotonic()
    ready = rss_mib(pid)
    samples = [(0.0, ready)]
    print(
        f"{'t (s)':>7} {'RSS MiB':>8} {'requests':>9} {'errors':>6}   "
        f"(RSS at ready: {ready:.0f} MiB)",
        flush=True,
    )
    tasks = [
        asyncio.create_task(_client(i, base_url, start + duration, budget, counts))
        for i in range(clients)
    ]
    cut = 0
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=every)
        if time.monotonic() > start + duration + grace:
            cut = sum(not t.done() for t in tasks)
            for task in tasks:
                task.cancel()  # closes their connections: the server aborts those requests
            await asyncio.gather(*tasks, return_exceptions=True)
        samples.append((time.monotonic() - start, rss_mib(pid)))
        print(
            f"{samples[-1][0]:7.0f} {samples[-1][1]:8.0f} "
            f"{counts.total:9d} {len(counts.errors):6d}",
            flush=True,
        )
    await asyncio.sleep(2)  # let aborts of the last dropped streams land
    metrics = httpx.get(f"{base_url}/metrics").text
    usage = next(
        (
            line.split()[-1]
            for line in metrics.splitlines()
            if line.startswith("localchat_kv_cache_usage_perc ")
        ),
        "?",
    )
    peak = max(rss for _, rss in samples)
    final = rss_mib(pid)
    print(
        f"\nrequests {counts.done}, errors {len(counts.errors)}, cut at the end {cut}, "
        f"KV usage after {usage}"
    )
    print(
        f"RSS: ready {ready:.0f} MiB, peak {peak:.0f} MiB (+{peak - ready:.0f}), "
        f"end {final:.0f} MiB (+{final - ready:.0f}) "
        f"after {time.monotonic() - start:.0f} s with {clients} clients"
    )
    # the KV pool is zeroed at start-up, so it is all in the RSS at ready
    print("(the RSS at ready includes the whole KV pool: --kv-cache-memory, 1 GiB on a CPU)")
    for error in sorted(set(counts.errors))[:10]:
        print("  error:", error)
    return 1 if counts.errors else 0


def _start_server(serve_args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    from tests.serve_process import _wait_until_healthy

    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "localchat", "serve", "--port", "0", *serve_args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        return process, _wait_until_healthy(process, log_path, timeout=300)
    except BaseException:
        process.kill()
        raise


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument(
        "--max-requests", type=int, default=100_000, help="stop after this many requests"
    )
    parser.add_argument("--every", type=float, default=15.0, help="seconds between RSS lines")
    parser.add_argument(
        "--grace", type=float, default=60.0, help="seconds running requests get after --duration"
    )
    parser.add_argument("--url", help="an already running server (give its --pid too)")
    parser.add_argument("--pid", type=int)
    parser.add_argument("serve_args", nargs="*", help="after --: arguments for `localchat serve`")
    args = parser.parse_args()
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid (the server's process id, to read its RSS)")
        return asyncio.run(
            soak(
                args.url.rstrip("/"),
                args.pid,
                args.clients,
                args.duration,
                args.max_requests,
                args.every,
                args.grace,
            )
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log_path = Path(tempfile.mkdtemp(prefix="localchat-soak-")) / "serve.log"
    process, base_url = _start_server(args.serve_args, log_path)
    try:
        return asyncio.run(
            soak(
                base_url,
                process.pid,
                args.clients,
                args.duration,
                args.max_requests,
                args.every,
                args.grace,
            )
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        print(f"server log: {log_path}")


if __name__ == "__main__":
    sys.exit(main())
