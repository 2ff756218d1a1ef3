"""One system of an isolated bench (C4) in a process of its own: load the model (timed), warm up,
run the requests, and write the timings, load time and peak RSS as JSON.

    python -m localchat.bench.isolated_child SPEC.pickle RESULT.json

SPEC is written by `localchat.bench.isolated` in the parent. The llama.cpp child never imports
torch, so its RSS is llama.cpp's own plus a bare Python.
"""

from __future__ import annotations

import json
import pickle
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.bench.records import RunResult
from localchat.bench.workloads import BenchRequest

if TYPE_CHECKING:
    from localchat.config import EngineConfig

WARMUP_TOKENS = list(range(100, 108))


@dataclass
class IsolatedSpec:
    """What the child runs: `system` is 'localchat' or 'llama.cpp'; `config` (an EngineConfig) is
    used by localchat only, `n_ctx` by llama.cpp only."""

    system: str
    gguf_path: str
    requests: list[BenchRequest]
    num_threads: int
    n_ctx: int
    config: EngineConfig | None = None


def peak_rss_bytes() -> int:
    """This process's peak resident set. On Linux VmHWM, not ru_maxrss: ru_maxrss survives exec, so
    a child starts with its parent's RSS at fork as its peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak if sys.platform == "darwin" else peak * 1024


def rss_split_bytes() -> dict[str, int]:
    """Resident memory now, split into anonymous (heap, repacked weights, KV) and file-backed pages
    (a memory-mapped model: page cache the kernel may drop), which a peak RSS lumps together. Linux
    only."""
    split = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("RssAnon", "RssFile"):
                split[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return split


def _run_localchat(spec: IsolatedSpec) -> tuple[RunResult, float, dict[str, int]]:
    from localchat.bench.offline import run_engine, warm_up
    from localchat.engine.llm_engine import LLMEngine

    assert spec.config is not None  # the parent gives the localchat child its EngineConfig
    config = replace(spec.config, model=spec.gguf_path, num_threads=spec.num_threads)
    start = time.perf_counter()
    engine = LLMEngine(config)
    load_s = time.perf_counter() - start
    warm_up(engine, WARMUP_TOKENS)
    # measured while the model lives
    return run_engine(engine, spec.requests), load_s, rss_split_bytes()


def _run_llama_cpp(spec: IsolatedSpec) -> tuple[RunResult, float, dict[str, int]]:
    from localchat.bench.peer_llama_cpp import LlamaCppPeer

    start = time.perf_counter()
    peer = LlamaCppPeer(Path(spec.gguf_path), spec.num_threads, spec.n_ctx)
    load_s = time.perf_counter() - start
    peer.warm_up()
    return peer.run(spec.requests), load_s, rss_split_bytes()


def run(spec: IsolatedSpec) -> dict:
    rss_before_load = peak_rss_bytes()
    runner = _run_localchat if spec.system == "localchat" else _run_llama_cpp
    result, load_s, split = runner(spec)
    return {
        "label": result.label,
        "duration": result.duration,
        "engine": result.engine,
        "notes": result.notes,
        "records": [asdict(record) for record in result.records],
        "load_s": load_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_before_load_bytes": rss_before_load,
        "rss_split_bytes": split,
    }


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds, so cleanup code (a half-written cache) runs


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    signal.signal(signal.SIGTERM, _terminate)
    spec = pickle.loads(Path(spec_path).read_bytes())
    try:
        payload = run(spec)
    except Exception as exc:  # reported by the parent as this system's failure
        payload = {"error": f"{type(exc).__name__}: {exc}", "peak_rss_bytes": peak_rss_bytes()}
    Path(result_path).write_text(json.dumps(payload))
    return 0 if "error" not in payload else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
