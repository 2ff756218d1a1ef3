"""The result table and the --json payload (no model needed)."""

from __future__ import annotations

import json

from rich.console import Console

from localchat.bench.records import RequestRecord, RunResult, figures
from localchat.bench.report import (
    build_payload,
    load_baseline,
    print_report,
    write_json,
)


def _fig(label, duration):
    records = [RequestRecord(10, 3, start=0.0, token_times=[0.5, 0.75, 1.0])]
    return {"label": label, **figures(RunResult("s", label, records, duration), "throughput")}


def test_table_shows_every_system_and_the_ratio():
    console = Console(record=True, width=120)
    results = {"localchat": _fig("ours [fast]", 1.0), "hf": _fig("theirs", 2.0)}
    print_report(console, "title", results, {"localchat/hf": 2.0}, "throughput", ["a note"])
    text = console.export_text()
    for expected in ("localchat", "hf", "Output tok/s", "TTFT p99 (ms)", "ours [fast]", "2.00x", "a note"):
        assert expected in text


def test_json_payload_round_trips(tmp_path):
    payload = build_payload(mode="offline", workload={"name": "c2"}, model="m",
                            results={"localchat": _fig("ours", 1.0)}, ratios={}, notes=[])
    path = tmp_path / "out.json"
    write_json(str(path), payload)
    loaded = json.loads(path.read_text())
    assert loaded["command"].startswith("localchat")
    assert {"date", "machine", "versions", "results", "workload"} <= set(loaded)
    assert loaded["machine"]["cpu_count"] >= 1
    name, fig = load_baseline(str(path))
    assert name == "offline" and fig["output_tokens"] == 3
