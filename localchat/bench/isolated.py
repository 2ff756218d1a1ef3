"""Run one system of a bench in a child process that stays loaded between runs, and watch it: its
load time and peak RSS are its own, two systems can take turns on the same requests, and a child
that would exhaust the machine's memory is stopped before the kernel's OOM killer picks a victim (on
a shared machine, possibly someone else's process).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from localchat.bench.isolated_child import IsolatedSpec
from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest

POLL_S = 0.05
MIB = 1 << 20


def _meminfo_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_floor() -> int:
    """Stop a child when the machine's available memory falls below this: 1 GiB or 5% of it."""
    total = _meminfo_bytes("MemTotal") or 0
    return max(1 << 30, total // 20)


class IsolatedSystem:
    """One system (`spec.system`) loaded in `python -m localchat.bench.isolated_child`.

    `start()` loads it, `run(requests)` runs a round as often as asked, `close()` ends the child and
    returns its load time and peak RSS. A failure at any point is kept in `error`, and every later
    run comes back as a RunResult whose records carry it: never an exception.

    `child` is the program the child runs (the arguments after the interpreter, before the spec's
    path and the reply pipe); a bench with systems of its own (benchmarks/vision_ttft.py) names
    itself, sends its own commands with `call` and loads them with its spec's `load`."""

    def __init__(self, spec: IsolatedSpec, column: str, child: list[str] | None = None):
        self.spec, self.column = spec, column
        self.child = child or ["-m", "localchat.bench.isolated_child"]
        self.label = f"{spec.system} (failed)"
        self.error: str | None = None
        self.memory: dict[str, Any] = {}  # rss_before_load_bytes, peak_rss_bytes, rss_split_bytes
        self.load_s: float | None = None
        self._process: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="localchat-bench-")
        self._log = Path(self._tmp.name, "stderr")
        self._buffer = b""
        self._replies = -1
        self._polled_peak = 0

    def start(self) -> bool:
        """Launch the child and wait until it has loaded and warmed up; False if it failed."""
        spec_path = Path(self._tmp.name, "spec.pickle")
        spec_path.write_bytes(pickle.dumps(self.spec))
        read_end, write_end = os.pipe()
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, *self.child, str(spec_path), str(write_end)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                pass_fds=(write_end,),
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
        os.close(write_end)
        self._replies = read_end
        reply = self._wait()
        if reply is not None:
            self.label, self.load_s = reply["label"], reply["load_s"]
            self.memory["rss_before_load_bytes"] = reply["rss_before_load_bytes"]
        return self.error is None

    def run(self, requests: list[BenchRequest]) -> RunResult:
        """One round: the child runs `requests` as its system does (all arriving at once)."""
        if self.error is None:
            command = {"run": [[r.prompt_token_ids, r.output_len] for r in requests]}
            if self._send(command) and (reply := self._wait()) is not None:
                records = [RequestRecord(**record) for record in reply["records"]]
                return RunResult(
                    self.column,
                    self.label,
                    records,
                    reply["duration"],
                    reply["engine"],
                    notes=reply["notes"] or [],
                )
        records = [
            RequestRecord(len(r.prompt_token_ids), r.output_len, error=self.error) for r in requests
        ]
        return RunResult(self.column, f"{self.spec.system} (failed)", records, 0.0)

    def call(self, command: dict) -> dict | None:
        """Send the child a command its system answers itself (isolated_child.serve) and return
        the reply; None (and `error` set) where the child failed."""
        if self.error is None and self._send(command):
            return self._wait()
        return None

    def close(self) -> dict:
        """End the child (asking it for its peak RSS first, while it still holds the model) and
        return this system's figures: load_s, peak_rss_mib, rss_before_load_mib and, on Linux,
        rss_anon_end_mib and rss_file_end_mib."""
        if self.error is None and self._send({"quit": True}):
            reply = self._wait()
            if reply is not None:
                self.memory.update(reply)
        self._stop(graceful=True)
        if self._replies >= 0:
            os.close(self._replies)
            self._replies = -1
        self._tmp.cleanup()
        peak = self.memory.get("peak_rss_bytes") or self._polled_peak or None
        figures: dict = {"load_s": self.load_s, "peak_rss_mib": peak and peak / MIB}
        if "rss_before_load_bytes" in self.memory:
            figures["rss_before_load_mib"] = self.memory["rss_before_load_bytes"] / MIB
        split = self.memory.get("rss_split_bytes") or {}
        for key, value in split.items():  # RssAnon -> rss_anon_end_mib
            figures[f"rss_{key.removeprefix('Rss').lower()}_end_mib"] = value / MIB
        return figures

    def _send(self, command: dict) -> bool:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write((json.dumps(command) + "\n").encode())
            self._process.stdin.flush()
        except OSError:  # the child is gone; _wait says why
            return self._wait() is not None
        return True

    def _wait(self) -> dict | None:
        """The child's next reply; None (and `error` set, the child stopped) when it failed, died or
        had to be stopped for memory."""
        process = self._process
        assert process is not None
        floor = memory_floor()
        try:
            while b"\n" not in self._buffer:
                ready, _, _ = select.select([self._replies], [], [], POLL_S)
                if ready:
                    chunk = os.read(self._replies, 1 << 16)
                    if not chunk:  # the child has exited without a reply
                        process.wait()
                        return self._fail_with(self._exit_error(process.returncode))
                    self._buffer += chunk
                    continue
                self._polled_peak = max(self._polled_peak, _rss_bytes(process.pid) or 0)
                available = _meminfo_bytes("MemAvailable")
                if available is not None and available < floor:
                    return self._fail_with(
                        f"stopped: the machine's available memory fell below "
                        f"{floor / 2**30:.1f} GiB (the child's RSS reached "
                        f"{self._polled_peak / 2**30:.1f} GiB)"
                    )
        except BaseException:
            self._stop()
            raise
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if reply["event"] == "error":
            self.memory["peak_rss_bytes"] = reply.get("peak_rss_bytes") or 0
            return self._fail_with(reply["error"])
        return reply

    def _exit_error(self, returncode: int) -> str:
        tail = self._log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"exit status {returncode}: {' | '.join(tail) or 'no output'}"

    def _fail_with(self, error: str) -> dict | None:
        """Keep `error`, stop the child, and give _wait's answer for a failure: None."""
        self.error = error
        self._stop()
        return None

    def _stop(self, graceful: bool = False) -> None:
        """End the child: `graceful` once it has said goodbye (it is on its way out), else at
        once."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # a child waiting for a command ends by itself
        if graceful:
            try:
                process.wait(timeout=15)
                return
            except subprocess.TimeoutExpired:
                pass
        process.terminate()  # the child turns SIGTERM into SystemExit, so its cleanup runs
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_isolated(spec: IsolatedSpec, requests: list[BenchRequest], column: str) -> RunResult:
    """Load `spec` in a child, run `requests` once and end it; load time and peak RSS come back in
    the result's `engine` figures, a failure as records that carry the error (and a note)."""
    system = IsolatedSystem(spec, column)
    system.start()
    result = system.run(requests)
    figures = system.close()
    result.engine = {**(result.engine or {}), **figures}
    if system.error is not None:
        result.notes.append(f"{column}: {system.error}")
    return result
