"""One system of an isolated bench (C4) in a process of its own, kept loaded between rounds: load
the model (timed), warm up, then run each round of requests the parent sends, and at the end report
the peak RSS.

    python -m localchat.bench.isolated_child SPEC.pickle FD

SPEC is written by `localchat.bench.isolated` in the parent. Commands come as JSON lines on stdin,
replies go as JSON lines to the file descriptor FD (stdout is left to the libraries, which may
print there):

    (once loaded)                        -> {"event": "ready", label, load_s, rss_before_load_bytes}
    {"run": [[prompt ids, output len]]}  -> {"event": "result", duration, engine, notes, records}
    {"quit": true}                       -> {"event": "bye", peak_rss_bytes, rss_split_bytes}
    any other command                    -> {"event": "result", **system.call(command)}

A failure replies {"event": "error", "error", "peak_rss_bytes"} and ends the child. The llama.cpp
child never imports torch, so its RSS is llama.cpp's own plus a bare Python.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from localchat.bench.records import RunResult
from localchat.bench.workloads import BenchRequest

if TYPE_CHECKING:
    from localchat.config import EngineConfig

WARMUP_TOKENS = list(range(100, 108))


@dataclass
class IsolatedSpec:
    """What the child loads: `system` is 'localchat' or 'llama.cpp'; `config` (an EngineConfig) is
    used by localchat only, `n_ctx` by llama.cpp only."""

    system: str
    gguf_path: str
    num_threads: int
    n_ctx: int
    config: EngineConfig | None = None

    def load(self) -> _System:
        """The system, loaded (a bench's own spec may load a system of its own, which answers
        the commands other than run and quit: benchmarks/vision_ttft.py)."""
        return _load(self)


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


class _System(Protocol):
    label: str

    def warm_up(self) -> None: ...

    def run(self, requests: list[BenchRequest]) -> RunResult: ...


class _Localchat:
    def __init__(self, spec: IsolatedSpec):
        from localchat.bench.offline import engine_label
        from localchat.engine.core.llm_engine import LLMEngine

        assert spec.config is not None  # the parent gives the localchat child its EngineConfig
        config = replace(spec.config, model=spec.gguf_path, num_threads=spec.num_threads)
        self.engine = LLMEngine(config)
        self.label = engine_label(self.engine)

    def warm_up(self) -> None:
        from localchat.bench.offline import warm_up

        warm_up(self.engine, WARMUP_TOKENS)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        from localchat.bench.offline import run_engine

        return run_engine(self.engine, requests)


def _load(spec: IsolatedSpec) -> _System:
    if spec.system == "localchat":
        return _Localchat(spec)
    from localchat.bench.peer_llama_cpp import LlamaCppPeer

    return LlamaCppPeer(Path(spec.gguf_path), spec.num_threads, spec.n_ctx)


def _result(result: RunResult) -> dict:
    return {
        "event": "result",
        "duration": result.duration,
        "engine": result.engine,
        "notes": result.notes,
        "records": [asdict(record) for record in result.records],
    }


def serve(spec: IsolatedSpec, commands, reply) -> None:
    """Load, warm up and say so; then answer `commands` (JSON lines) through `reply` until told to
    quit or the commands end."""
    if spec.system == "localchat":
        # the C++ kernels' one-time build for this machine (minutes on a slow host, cached after) is
        # not a load, as llama.cpp's compile at install is not
        from localchat.kernels.cpu_extension import cpu_kernels

        cpu_kernels()
    rss_before_load = peak_rss_bytes()
    start = time.perf_counter()
    system = spec.load()
    load_s = time.perf_counter() - start
    system.warm_up()
    reply(
        {
            "event": "ready",
            "label": system.label,
            "load_s": load_s,
            "rss_before_load_bytes": rss_before_load,
        }
    )
    for line in commands:
        command = json.loads(line)
        if "run" in command:
            requests = [BenchRequest(list(ids), int(n)) for ids, n in command["run"]]
            reply(_result(system.run(requests)))
        elif command.get("quit"):
            # measured while the model lives
            reply(
                {
                    "event": "bye",
                    "peak_rss_bytes": peak_rss_bytes(),
                    "rss_split_bytes": rss_split_bytes(),
                }
            )
            return
        else:  # a command of the bench's own system
            reply({"event": "result", **system.call(command)})  # type: ignore[attr-defined]


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds, so cleanup code (a half-written cache) runs


def main(argv: list[str]) -> int:
    spec_path, fd = argv
    signal.signal(signal.SIGTERM, _terminate)
    spec = pickle.loads(Path(spec_path).read_bytes())
    with os.fdopen(int(fd), "w") as out:

        def reply(message: dict) -> None:
            out.write(json.dumps(message) + "\n")
            out.flush()

        try:
            serve(spec, sys.stdin, reply)
        except Exception as exc:  # reported by the parent as this system's failure
            reply(
                {
                    "event": "error",
                    "error": f"{type(exc).__name__}: {exc}",
                    "peak_rss_bytes": peak_rss_bytes(),
                }
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
