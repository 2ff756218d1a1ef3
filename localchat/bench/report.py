"""The result table (one column per system, the ratio to each peer under it) and the --json file."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat.bench.records import HEADLINES

SCHEMA_VERSION = 1


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _rows(results: dict[str, dict], kind: str) -> list[tuple[str, list[str]]]:
    figs = list(results.values())

    def row(name, fn):
        return (name, [fn(f) for f in figs])

    rows = [
        row("Requests", lambda f: _num(f.get("requests"))),
        row("Failures", lambda f: _num(f.get("failures"))),
        row("Prompt tokens", lambda f: _num(f.get("prompt_tokens"))),
        row("Output tokens", lambda f: _num(f.get("output_tokens"))),
        row("Wall time (s)", lambda f: _num(f.get("duration_s"), 2)),
        row("Output tok/s", lambda f: _num(f.get("output_throughput"))),
        row("Total tok/s", lambda f: _num(f.get("total_throughput"))),
    ]
    if kind == "decode":
        rows.append(row("Decode tok/s (tokens 17..n)", lambda f: _num(f.get("decode_tok_s"))))
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        for stat in ("mean", "p50", "p99"):
            rows.append(
                row(f"{name} {stat} (ms)", lambda f, k=key, s=stat: _num((f.get(k) or {}).get(s)))
            )
    if kind == "chat":
        turns = max(len(f.get("turn_ttft_ms") or []) for f in figs)
        for turn in range(turns):
            rows.append(
                row(
                    f"TTFT turn {turn + 1} (ms)",
                    lambda f, t=turn: _num((f.get("turn_ttft_ms") or [None] * (t + 1))[t]),
                )
            )
    rows += [
        row("Peak KV-cache usage", lambda f: _pct(f.get("peak_kv_cache_usage"))),
        row("Prefix-cache hit rate", lambda f: _pct(f.get("prefix_cache_hit_rate"))),
        row("Preemptions", lambda f: _num(f.get("num_preemptions"))),
    ]
    return rows


def print_report(
    console: Console,
    title: str,
    results: dict[str, dict],
    ratios: dict[str, float | None],
    kind: str,
    notes: list[str],
) -> None:
    """`results` maps a column name to its figures (with a 'label'); ratios are
    'ours/peer' -> times."""
    table = Table(title=escape(title), title_justify="left")
    table.add_column("Metric", no_wrap=True)
    for name in results:
        table.add_column(escape(name), justify="right", no_wrap=True)
    for name, cells in _rows(results, kind):
        table.add_row(name, *cells)
    console.print(table)
    for name, fig in results.items():
        console.print(f"  [bold]{escape(name)}[/]: {escape(fig['label'])}")
    what = HEADLINES[kind][1]
    for pair, value in ratios.items():
        ours, peer = pair.split("/")
        if value is None:
            console.print(f"  {ours} vs {peer}: no ratio ({what} missing)")
        else:
            verdict = "better" if value >= 1 else "worse"
            console.print(f"  [bold]{ours} vs {peer}: {value:.2f}x on {what}[/] ({ours} {verdict})")
    for note in notes:
        console.print(f"  note: {escape(note)}", style="yellow")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if "torch" in sys.modules:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info


def versions() -> dict:
    out = {}
    for package in ("localchat", "torch", "transformers", "llama_cpp_python", "httpx"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package.replace("_", "-"))
    return out


def command_line() -> str:
    return " ".join(["localchat", *(shlex.quote(a) for a in sys.argv[1:])])


def build_payload(
    *,
    mode: str,
    workload: dict,
    model: str,
    results: dict[str, dict],
    ratios: dict[str, float | None],
    notes: list[str],
    extra: dict | None = None,
    command: str | None = None,
) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "mode": mode,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command or command_line(),
        "model": model,
        "workload": workload,
        "machine": machine_info(),
        "versions": versions(),
        "results": results,
        "ratios": ratios,
        "notes": notes,
        **(extra or {}),
    }


def write_json(path: str, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")


def load_baseline(path: str) -> tuple[str, dict]:
    """The offline localchat figures of an earlier --json file (for S1: server vs offline)."""
    from localchat.errors import LocalchatError

    try:
        payload = json.loads(Path(path).read_text())
        fig = payload["results"]["localchat"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalchatError(
            f"--baseline {path}: not a `localchat bench --json` file of an offline run ({exc})"
        ) from None
    return "offline", {
        **fig,
        "label": f"offline localchat, from {path} ({payload.get('date', '?')})",
    }
