"""The command's wiring without a model: flags reach the runner, the JSON records the command
line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localchat.bench import runner
from localchat.bench.records import RequestRecord, RunResult
from localchat.cli import app


def _fake_outcome(kind="throughput"):
    outcome = runner.BenchOutcome("fake-model")
    ours = outcome.add(
        "localchat",
        RunResult("localchat", "ours", [RequestRecord(5, 2, 0.0, [0.1, 0.2])], 1.0),
        kind,
    )
    peer = outcome.add(
        "hf", RunResult("hf", "peer", [RequestRecord(5, 2, 0.0, [0.2, 0.4])], 2.0), kind
    )
    outcome.ratios["localchat/hf"] = ours["output_throughput"] / peer["output_throughput"]
    return outcome


def test_offline_flags_and_json(monkeypatch, tmp_path):
    seen = {}

    def fake_run_offline(config, workload, peers, **kwargs):
        seen.update(config=config, workload=workload, peers=peers, **kwargs)
        return _fake_outcome()

    monkeypatch.setattr(runner, "run_offline", fake_run_offline)
    path = tmp_path / "out.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--no-progress",
            "-n",
            "5",
            "--input-len",
            "10:20",
            "--compare",
            "hf",
            "--seed",
            "7",
            "--max-num-seqs",
            "4",
            "--json",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen["workload"].num_requests == 5 and seen["workload"].input_len == (10, 20)
    assert seen["peers"] == ["hf"] and seen["config"].max_num_seqs == 4 and seen["config"].seed == 7
    payload = json.loads(path.read_text())
    assert payload["command"] == (
        "localchat bench --num-requests 5 --input-len 10:20 --compare hf "
        "--json " + str(path) + " --no-progress --max-num-seqs 4 --seed 7"
    )
    assert payload["workload"]["seed"] == 7 and payload["ratios"]["localchat/hf"] == pytest.approx(
        2.0
    )
    assert "2.00x" in result.output


def test_c7_flags_reach_the_paired_runner(monkeypatch, tmp_path):
    """-w c7 runs C4's paired machinery with its own sizes, --kv-cache-dtype reaches the engine's
    config, and the outcome's record (the KV figures) lands in the JSON."""
    from localchat.bench import big_model

    seen = {}

    def fake_run_big_model(config, workload, peers, **kwargs):
        seen.update(config=config, workload=workload, peers=peers, **kwargs)
        outcome = _fake_outcome("decode")
        outcome.record["kv_cache"] = {"run_dtype": "q8_0"}
        return outcome

    monkeypatch.setattr(big_model, "run_big_model", fake_run_big_model)
    path = tmp_path / "c7.json"
    args = ["bench", "--no-progress", "-w", "c7", "--gguf", str(tmp_path / "f.gguf")]
    args += ["--compare", "llama-cpp", "--kv-cache-dtype", "q8_0", "--json", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    workload = seen["workload"]
    assert (workload.name, workload.input_len, workload.output_len, workload.rounds) == (
        "c7",
        (8192, 8192),
        (256, 256),
        2,
    )
    assert seen["peers"] == ["llama.cpp"] and seen["gguf"] == str(tmp_path / "f.gguf")
    assert seen["config"].kv_cache_dtype == "q8_0"
    payload = json.loads(path.read_text())
    assert payload["workload"]["name"] == "c7" and payload["workload"]["kv_bytes"] is True
    assert payload["kv_cache"] == {"run_dtype": "q8_0"}
    assert "--kv-cache-dtype q8_0" in payload["command"]


def test_the_help_lists_c7():
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "c5, c7" in result.output


def test_online_masks_the_api_key(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "run_online_bench", lambda *a, **k: _fake_outcome())
    path = tmp_path / "out.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--no-progress",
            "--url",
            "http://x:1",
            "--api-key",
            "s3cret",
            "--concurrency",
            "8",
            "--json",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(path.read_text())
    assert "s3cret" not in path.read_text() and "--api-key '***'" in payload["command"]
    assert payload["mode"] == "online" and payload["workload"]["concurrency"] == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--compare", "vllm"], "--compare takes hf or llama-cpp"),
        (["--url", "http://x:1", "--compare", "hf"], "--baseline"),
        (["--workload", "c9"], "--workload must be one of"),
        (["--input-len", "9:3"], "--input-len must be MIN:MAX"),
        (["--hf-batch-size", "0"], "--hf-batch-size must be >= 1"),
        (["--url", "http://x:1", "--concurrency", "0"], "--concurrency must be >= 1"),
        (["--url", "http://x:1", "--request-rate", "0"], "--request-rate must be > 0"),
        (["--url", "http://x:1", "--endpoint", "chat"], "--endpoint must be one of"),
        (["--endpoint", "messages"], "add --url"),
    ],
)
def test_bad_flags_are_one_line_errors(args, message):
    result = CliRunner().invoke(app, ["bench", "--no-progress", *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    "endpoint, events",
    [
        (
            "messages",
            [
                {"type": "message_start"},
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}},
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "!"}},
                {
                    "type": "message_delta",
                    "usage": {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 2},
                },
            ],
        ),
        (
            "responses",
            [
                {"type": "response.created"},
                {"type": "response.output_text.delta", "delta": "Hi"},
                {"type": "response.output_text.delta", "delta": "!"},
                {
                    "type": "response.completed",
                    "response": {"usage": {"input_tokens": 10, "output_tokens": 2}},
                },
            ],
        ),
    ],
)
def test_text_endpoint_events_read_into_a_record(endpoint, events):
    """A text delta is a token's arrival; the usage sets both token counts (Anthropic's
    input_tokens leave out the cached ones); an error event raises."""
    from localchat.bench.online import TEXT_ENDPOINTS
    from localchat.bench.online_text import TEXT
    from localchat.client import APIError

    protocol = TEXT_ENDPOINTS[endpoint]
    record = RequestRecord(99, 4)
    kinds = [protocol.read(event, record) for event in events]
    assert kinds == [None, TEXT, TEXT, None]
    assert (record.prompt_len, record.num_output_tokens) == (10, 2)
    body = protocol.body("m", "the prompt", 4)
    assert body["stream"] is True and body["temperature"] == 0.0 and 4 in body.values()
    error = {"type": "error", "error": {"message": "boom"}, "message": "boom"}
    with pytest.raises(APIError, match="boom"):
        protocol.read(error, record)
