"""Run one system of a bench in a child process and watch it: its load time and peak RSS are its
own, and a child that would exhaust the machine's memory is stopped before the kernel's OOM killer
picks a victim (on a shared machine, possibly someone else's process).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localchat.bench.isolated_child import IsolatedSpec
from localchat.bench.records import RequestRecord, RunResult

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


def _stop(process: subprocess.Popen) -> None:
    process.terminate()  # the child turns SIGTERM into SystemExit, so its cleanup runs
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_isolated(spec: IsolatedSpec, column: str) -> RunResult:
    """Run `spec` in `python -m localchat.bench.isolated_child`; a failure comes back as a RunResult
    whose records carry the error (and a note), never as an exception."""
    floor = memory_floor()
    with tempfile.TemporaryDirectory(prefix="localchat-bench-") as tmp:
        spec_path, result_path, log_path = (
            Path(tmp, "spec.pickle"),
            Path(tmp, "result.json"),
            Path(tmp, "stderr"),
        )
        spec_path.write_bytes(pickle.dumps(spec))
        stopped_for_memory = False
        polled_peak = 0
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "localchat.bench.isolated_child",
                    str(spec_path),
                    str(result_path),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
            try:
                while process.poll() is None:
                    polled_peak = max(polled_peak, _rss_bytes(process.pid) or 0)
                    available = _meminfo_bytes("MemAvailable")
                    if available is not None and available < floor:
                        stopped_for_memory = True
                        _stop(process)
                        break
                    time.sleep(POLL_S)
            except BaseException:
                _stop(process)
                raise
        payload = json.loads(result_path.read_text()) if result_path.is_file() else {}
        log_tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
    if stopped_for_memory:
        error = (
            f"stopped: the machine's available memory fell below {floor / 2**30:.1f} GiB "
            f"(the child's RSS reached {polled_peak / 2**30:.1f} GiB)"
        )
    elif "records" not in payload:
        error = (
            payload.get("error")
            or f"exit status {process.returncode}: {' | '.join(log_tail) or 'no output'}"
        )
    else:
        return _result(column, payload)
    records = [
        RequestRecord(len(r.prompt_token_ids), r.output_len, error=error) for r in spec.requests
    ]
    peak = payload.get("peak_rss_bytes") or polled_peak or None
    return RunResult(
        column,
        f"{spec.system} (failed)",
        records,
        0.0,
        {"peak_rss_mib": peak and peak / MIB},
        notes=[f"{column}: {error}"],
    )


def _result(column: str, payload: dict) -> RunResult:
    records = [RequestRecord(**record) for record in payload["records"]]
    extra = {
        **(payload.get("engine") or {}),
        "load_s": payload["load_s"],
        "peak_rss_mib": payload["peak_rss_bytes"] / MIB,
        "rss_before_load_mib": payload["rss_before_load_bytes"] / MIB,
    }
    for key, value in (payload.get("rss_split_bytes") or {}).items():  # RssAnon -> rss_anon_end_mib
        extra[f"rss_{key.removeprefix('Rss').lower()}_end_mib"] = value / MIB
    return RunResult(
        column,
        payload["label"],
        records,
        payload["duration"],
        extra,
        notes=payload.get("notes") or [],
    )
