"""Soak test: many clients against one `localchat serve` on 127.0.0.1, reporting the server's RSS
over time (its replicas' included), its 5xx answers and time to first token.

Each client loops until the time or request budget is spent, cycling through full streams, streams
dropped after a few chunks, whole completions, embeddings, chats with tools, json_schema chats,
Anthropic Messages, OpenAI Responses, malformed requests and /tokenize calls. Every `--every`
seconds a line gives the RSS and the requests done. At the end, requests still running get
`--grace` seconds, then are cut (counted apart, not as errors); the RSS at ready, at two minutes,
the peak and the last, the error and 5xx counts and the p99 TTFT of the streams of the first and
the last five minutes are printed, with a verdict against issue 42's bounds (RSS within +300 MB of
the two-minute mark, no 5xx, the last p99 TTFT within 1.5x of the first, every answered Responses
call read back unchanged from the server at the end: nothing answered is lost). With
`--kill-replica-at S` (a data-parallel server: `-- -dp 2`), replica 0 gets SIGKILL after S seconds:
the requests running there end with an error naming it (counted apart), and the time until
/health is 200 again (the replica started again) is printed. It stops by itself.

    # 64 clients, 10 minutes, its own server (default model)
    python benchmarks/soak.py
    # 30 minutes, two replicas, one killed after 10 minutes; args after -- go to serve
    python benchmarks/soak.py --duration 1800 --kill-replica-at 600 -- -dp 2 --max-num-seqs 32
    # an already running server
    python benchmarks/soak.py --url http://127.0.0.1:8000 --pid 1234
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
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

KINDS = (
    "stream",
    "dropped",
    "completion",
    "embeddings",
    "tools",
    "json_schema",
    "messages",
    "responses",
    "malformed",
    "tokenize",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
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


MODEL = ["default"]  # the server's model, as /v1/models names it (the Messages API asks for it)


class KilledReplica(Exception):
    """A request that was running on the replica --kill-replica-at killed."""


@dataclass
class Counts:
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: list[str] = field(default_factory=list)
    server_errors: int = 0  # 5xx answers (a killed replica's 503s apart)
    killed: int = 0  # requests that ended with the killed replica's error
    ttfts: list[tuple[float, float]] = field(default_factory=list)  # (start, TTFT) of streams
    # the Responses answered (stored by the server): id -> their output, read back at the end
    answered: dict[str, list] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.done.values())


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (a data-parallel server's replicas)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            pids += _tree(int(child))
    return pids


def rss_mib(pid: int) -> float:
    """The RSS of `pid` and its descendants, in MiB."""
    total = 0.0
    for member in _tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:  # exited meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def _check(kind: str, response: httpx.Response, counts: Counts, expected: int = 200) -> None:
    if response.status_code == expected:
        return
    text = response.text[:300]
    if "data-parallel replica" in text:
        raise KilledReplica(text)
    if response.status_code >= 500:
        counts.server_errors += 1
    raise RuntimeError(f"{kind}: HTTP {response.status_code}: {text}")


def _chat_body(rng: random.Random, stream: bool) -> dict:
    words = " and ".join(rng.choice(TOPICS) for _ in range(rng.randint(1, 8)))
    return {
        "messages": [{"role": "user", "content": f"Write about {words}."}],
        "stream": stream,
        "max_tokens": rng.randint(8, 64),
        "temperature": rng.choice([0, 0.7, 1.0]),
        "seed": rng.randint(0, 9),
    }


async def _one(client: httpx.AsyncClient, kind: str, rng: random.Random, counts: Counts) -> None:
    if kind in ("stream", "dropped"):
        keep = 10**9 if kind == "stream" else rng.randint(1, 4)
        started = time.monotonic()
        first: float | None = None
        async with client.stream(
            "POST", "/v1/chat/completions", json=_chat_body(rng, True)
        ) as response:
            if response.status_code != 200:
                await response.aread()
                _check(kind, response, counts)
            seen = 0
            line = ""
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    if '"error"' in line:
                        if "data-parallel replica" in line:
                            raise KilledReplica(line[:300])
                        raise RuntimeError(f"{kind}: {line[:300]}")
                    if first is None and '"content"' in line:
                        first = time.monotonic() - started
                    seen += 1
                    if seen >= keep or line == "data: [DONE]":
                        break
            if kind == "stream":
                if line != "data: [DONE]":
                    raise RuntimeError("stream ended without [DONE]")
                if first is not None:
                    counts.ttfts.append((started, first))
    elif kind == "completion":
        body = {
            "prompt": f"Once upon a time, {rng.choice(TOPICS)}",
            "max_tokens": rng.randint(4, 64),
            "logprobs": rng.choice([None, 2]),
        }
        response = await client.post("/v1/completions", json=body)
        _check(kind, response, counts)
        if not response.json()["choices"]:
            raise RuntimeError("completion: no choices")
    elif kind == "embeddings":
        inputs = [f"{rng.choice(TOPICS)} " * rng.randint(1, 30) for _ in range(rng.randint(1, 8))]
        response = await client.post("/v1/embeddings", json={"input": inputs})
        _check(kind, response, counts)
        if len(response.json()["data"]) != len(inputs):
            raise RuntimeError("embeddings: one vector per input expected")
    elif kind == "tools":
        body = _chat_body(rng, False) | {"tools": TOOLS}
        body["messages"] = [
            {"role": "user", "content": f"What is the weather in {rng.choice(TOPICS)}?"}
        ]
        _check(kind, await client.post("/v1/chat/completions", json=body), counts)
    elif kind == "json_schema":
        body = _chat_body(rng, False) | {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON},
            },
            "max_tokens": 48,
        }
        response = await client.post("/v1/chat/completions", json=body)
        _check(kind, response, counts)
        choice = response.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            json.loads(choice["message"]["content"])  # a length cut may end mid-object
    elif kind == "messages":
        body = {
            "model": MODEL[0],
            "max_tokens": rng.randint(8, 48),
            "messages": [{"role": "user", "content": f"Tell me about {rng.choice(TOPICS)}."}],
            "stream": rng.random() < 0.5,
        }
        response = await client.post("/v1/messages", json=body)
        _check(kind, response, counts)
        if body["stream"] and "event: message_stop" not in response.text:
            if "event: error" in response.text and "data-parallel replica" in response.text:
                raise KilledReplica(response.text[-300:])  # its stream's error event names it
            raise RuntimeError("messages: stream without message_stop")
    elif kind == "responses":
        body = {
            "input": f"Tell me about {rng.choice(TOPICS)}.",
            "max_output_tokens": rng.randint(16, 48),
        }
        response = await client.post("/v1/responses", json=body)
        _check(kind, response, counts)
        answer = response.json()
        if answer["status"] not in ("completed", "incomplete"):
            raise RuntimeError(f"responses: status {answer['status']}")
        counts.answered[answer["id"]] = answer["output"]
    elif kind == "malformed":
        bad = rng.choice(
            [
                b"{not json",
                json.dumps({"messages": []}).encode(),
                json.dumps({"prompt": "x", "temperature": -3}).encode(),
                json.dumps({"prompt": [10**9]}).encode(),
                b"[" * 5000 + b"]" * 5000,
            ]
        )
        response = await client.post(
            "/v1/completions", content=bad, headers={"content-type": "application/json"}
        )
        _check(kind, response, counts, expected=400)
    else:
        response = await client.post(
            "/tokenize", json={"prompt": " ".join(TOPICS * rng.randint(1, 20))}
        )
        _check(kind, response, counts)


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
                await _one(client, kind, rng, counts)
                counts.done[kind] += 1
            except KilledReplica:
                counts.killed += 1
            except Exception as exc:  # counted and shown, the soak goes on
                counts.errors.append(f"{type(exc).__name__}: {exc}")


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _replica_pid(log_path: Path | None, index: int) -> int | None:
    """Replica `index`'s process id, from the server's log."""
    if log_path is None:
        return None
    found = re.findall(rf"data-parallel replica {index} \(pid (\d+)\) ready", log_path.read_text())
    return int(found[-1]) if found else None


async def _kill_replica(base_url: str, log_path: Path | None, at: float, report: dict) -> None:
    """SIGKILL replica 0 after `at` seconds; then wait for /health to be 200 again."""
    await asyncio.sleep(at)
    pid = _replica_pid(log_path, 0)
    if pid is None:
        report["kill"] = "no replica 0 in the server's log (serve with -dp 2)"
        return
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    print(f"killed data-parallel replica 0 (pid {pid})", flush=True)
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        await asyncio.sleep(1)
        while (await client.get("/health")).status_code != 200:
            await asyncio.sleep(0.5)
    report["kill"] = f"replica 0 (pid {pid}) killed at {at:.0f} s; /health 200 again after " + (
        f"{time.monotonic() - killed:.1f} s (pid {_replica_pid(log_path, 0)})"
    )
    print(report["kill"], flush=True)


async def _lost(base_url: str, answered: dict[str, list]) -> list[str]:
    """The answered Responses the server no longer gives back as they were answered (GET
    /v1/responses/{id}): answered work must outlive a killed replica."""
    lost = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for response_id, output in answered.items():
            got = await client.get(f"/v1/responses/{response_id}")
            if got.status_code != 200 or got.json().get("output") != output:
                lost.append(f"{response_id}: HTTP {got.status_code}")
    return lost


async def soak(
    base_url: str,
    pid: int,
    clients: int,
    duration: float,
    max_requests: int,
    every: float,
    grace: float,
    kill_at: float | None = None,
    log_path: Path | None = None,
) -> int:
    counts, budget = Counts(), [max_requests]
    MODEL[0] = httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]
    start = time.monotonic()
    ready = rss_mib(pid)
    samples = [(0.0, ready)]
    print(
        f"{'t (s)':>7} {'RSS MiB':>8} {'requests':>9} {'errors':>6} {'5xx':>5}   "
        f"(RSS at ready: {ready:.0f} MiB)",
        flush=True,
    )
    tasks = [
        asyncio.create_task(_client(i, base_url, start + duration, budget, counts))
        for i in range(clients)
    ]
    report: dict[str, str] = {}
    killer = (
        asyncio.create_task(_kill_replica(base_url, log_path, kill_at, report))
        if kill_at is not None
        else None
    )
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
            f"{counts.total:9d} {len(counts.errors):6d} {counts.server_errors:5d}",
            flush=True,
        )
    if killer is not None and not killer.done():
        try:
            await asyncio.wait_for(killer, timeout=300)
        except TimeoutError:
            report["kill"] = "/health did not turn 200 within 300 s of the soak's end"
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
    at_two = next((rss for t, rss in samples if t >= 120), ready)
    window = min(300.0, duration / 6)
    first = _p99([ttft for t, ttft in counts.ttfts if t - start < window])
    last = _p99([ttft for t, ttft in counts.ttfts if t - start >= duration - window])
    print(
        f"\nrequests {counts.done}, errors {len(counts.errors)} (5xx {counts.server_errors}), "
        f"ended by the killed replica {counts.killed}, cut at the end {cut}, KV usage after {usage}"
    )
    print(
        f"RSS: ready {ready:.0f} MiB, at 2 min {at_two:.0f}, peak {peak:.0f} MiB "
        f"(+{peak - ready:.0f}), end {final:.0f} MiB (+{final - at_two:.0f} over 2 min) "
        f"after {time.monotonic() - start:.0f} s with {clients} clients"
    )
    # the KV pool is zeroed at start-up, so it is all in the RSS at ready
    print("(the RSS at ready includes the whole KV pool: --kv-cache-memory, 1 GiB on a CPU)")
    ratio = last / first if first and last else None
    print(
        f"p99 TTFT of streams: first {window:.0f} s {first or 0:.3f} s, last {window:.0f} s "
        f"{last or 0:.3f} s" + (f" ({ratio:.2f}x)" if ratio else "")
    )
    if "kill" in report:
        print(report["kill"])
    lost = await _lost(base_url, counts.answered)
    print(
        f"answered Responses read back at the end: {len(counts.answered) - len(lost)} of "
        f"{len(counts.answered)} as answered" + (f"; lost: {lost[:5]}" if lost else "")
    )
    held = (
        final - at_two <= 300
        and counts.server_errors == 0
        and ratio is not None
        and ratio <= 1.5
        and not lost
    )
    print(
        f"issue 42's bounds (+300 MB, 0 5xx, TTFT 1.5x, nothing answered lost): "
        f"{'held' if held else 'NOT held'}"
    )
    for error in sorted(set(counts.errors))[:10]:
        print("  error:", error)
    return 1 if counts.errors or not held else 0


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
    parser.add_argument(
        "--kill-replica-at",
        type=float,
        help="SIGKILL data-parallel replica 0 after this many seconds (a server of -dp 2 or more)",
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
                args.kill_replica_at,
                log_path,
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
