"""Per-request timings and the figures derived from them, the same way for every system measured.

Times are `time.perf_counter()` seconds. A request's `start` is when it was handed to the system
(for an offline batch: the start of the run, since every request arrives at once); `token_times`
holds when each output token (online: each streamed chunk) reached the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from localchat.bench.workloads import DECODE_SKIP


@dataclass(slots=True)
class RequestRecord:
    prompt_len: int
    requested_output_len: int
    start: float = 0.0
    token_times: list[float] = field(default_factory=list)
    num_output_tokens: int | None = (
        None  # when the count differs from len(token_times) (online usage)
    )
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        return (
            self.num_output_tokens if self.num_output_tokens is not None else len(self.token_times)
        )

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first: (last - first token time) / (n - 1)."""
        n = self.output_tokens
        if n < 2 or len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def itls(self) -> list[float]:
        times = self.token_times
        return [b - a for a, b in pairwise(times)]


@dataclass
class RunResult:
    """One system's run over the workload."""

    system: str  # short key: localchat, hf, llama-cpp, server, or a baseline's name
    label: str  # what exactly ran, for the table header
    records: list[RequestRecord]
    duration: float
    engine: dict | None = None  # peak_kv_cache_usage, prefix_cache_hit_rate, num_preemptions
    notes: list[str] = field(default_factory=list)


def _stats_ms(values: list[float]) -> dict | None:
    if not values:
        return None
    array = np.asarray(values) * 1000.0
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
    }


def decode_tok_s(record: RequestRecord) -> float | None:
    """Tokens per second of pure decode: tokens 17..n over the time from token 16 to token n."""
    times = record.token_times
    if len(times) <= DECODE_SKIP:
        return None
    elapsed = times[-1] - times[DECODE_SKIP - 1]
    return (len(times) - DECODE_SKIP) / elapsed if elapsed > 0 else None


def figures(result: RunResult, kind: str) -> dict:
    """The figures of the result table and the --json file."""
    ok = [r for r in result.records if r.error is None]
    prompt_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    duration = result.duration
    out: dict[str, Any] = {
        "requests": len(result.records),
        "completed": len(ok),
        "failures": len(result.records) - len(ok),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "requested_output_tokens": sum(r.requested_output_len for r in result.records),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": output_tokens / duration if duration > 0 else None,
        "total_throughput": (prompt_tokens + output_tokens) / duration if duration > 0 else None,
        "ttft_ms": _stats_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _stats_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": _stats_ms([x for r in ok for x in r.itls]),
    }
    if kind == "decode" and ok:  # one request, or one a round (c4): their median
        speeds = [speed for r in ok if (speed := decode_tok_s(r)) is not None]
        out["decode_tok_s"] = float(np.median(speeds)) if speeds else None
    if kind == "chat":
        out["turn_ttft_ms"] = [
            r.ttft * 1000.0 if r.ttft is not None else None for r in result.records
        ]
    if result.engine:
        out.update(result.engine)
    return out


HEADLINES = {
    "throughput": ("output_throughput", "output tok/s", True),
    "decode": ("decode_tok_s", "decode tok/s", True),
    "chat": ("last_turn_ttft_ms", "last-turn TTFT", False),
}


def headline(fig: dict, kind: str) -> float | None:
    """The workload's one figure: output tok/s, decode tok/s, or the last chat turn's TTFT."""
    if kind == "chat":
        turns = fig.get("turn_ttft_ms") or []
        return turns[-1] if turns else None
    return fig.get(HEADLINES[kind][0])


def ratio(ours: dict, peer: dict, kind: str) -> float | None:
    """How many times better ours is than the peer on the headline figure (> 1: ours is better)."""
    a, b = headline(ours, kind), headline(peer, kind)
    if not a or not b:
        return None
    return a / b if HEADLINES[kind][2] else b / a
