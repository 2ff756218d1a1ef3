"""The result table and the --json payload (no model needed)."""

from __future__ import annotations

import json
import sys

import pytest
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
    for expected in (
        "localchat",
        "hf",
        "Output tok/s",
        "TTFT p99 (ms)",
        "ours [fast]",
        "2.00x",
        "a note",
    ):
        assert expected in text


def test_json_payload_round_trips(tmp_path):
    payload = build_payload(
        mode="offline",
        workload={"name": "c2"},
        model="m",
        results={"localchat": _fig("ours", 1.0)},
        ratios={},
        notes=[],
    )
    path = tmp_path / "out.json"
    write_json(str(path), payload)
    loaded = json.loads(path.read_text())
    assert loaded["command"].startswith("localchat")
    assert {"date", "machine", "versions", "results", "workload"} <= set(loaded)
    assert loaded["machine"]["cpu_count"] >= 1
    name, fig = load_baseline(str(path))
    assert name == "offline" and fig["output_tokens"] == 3


def _online(concurrency, duration):
    payload = build_payload(
        mode="online",
        workload={"name": "c2", "concurrency": concurrency},
        model="m",
        results={"server": _fig("server", duration)},
        ratios={},
        notes=[],
    )
    return payload


def test_plot_of_one_run_and_of_runs_against_concurrency(tmp_path):
    pytest.importorskip("matplotlib")
    from localchat.bench.plot import plot_runs

    one = build_payload(
        mode="offline",
        workload={"name": "c2"},
        model="m",
        ratios={},
        notes=[],
        results={"localchat": _fig("ours", 1.0), "hf": _fig("theirs", 2.0)},
    )
    png = tmp_path / "systems.png"
    plot_runs([one], str(png))
    assert png.read_bytes().startswith(b"\x89PNG")
    svg = tmp_path / "concurrency.svg"
    plot_runs([_online(8, 1.0), _online(1, 2.0), _online(32, 0.5)], str(svg))
    text = svg.read_text()
    assert "<svg" in text and "concurrency" in text and "Throughput" in text


def test_plot_without_matplotlib_or_with_a_bad_file_is_a_clear_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from localchat.bench.plot import PlotUnavailableError, require_matplotlib
    from localchat.cli import app

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(
        app, ["bench", "--plot", str(tmp_path / "p.png"), "--plot-with", str(bad)]
    )
    assert result.exit_code == 2 and "not a `localchat bench --json` file" in result.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailableError, match="pip install matplotlib"):
        require_matplotlib()
