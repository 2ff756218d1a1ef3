"""Workload selection, random requests and the figures derived from timings (no model needed)."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import pytest

from localchat.bench.records import (
    RequestRecord,
    RunResult,
    decode_tok_s,
    figures,
    headline,
    ratio,
)
from localchat.bench.runner import parse_peers
from localchat.bench.workloads import (
    WORKLOADS,
    allowed_token_ids,
    parse_range,
    random_requests,
    select_workload,
)
from localchat.errors import InvalidParameterError


def test_named_workloads_match_design():
    c2, g1 = WORKLOADS["c2"], WORKLOADS["g1"]
    assert (c2.num_requests, c2.input_len, c2.output_len) == (32, (32, 256), (32, 128))
    assert (g1.num_requests, g1.input_len, g1.output_len, g1.load_format, g1.dtype) == (
        256,
        (100, 1024),
        (100, 1024),
        "dummy",
        "bfloat16",
    )
    assert WORKLOADS["c1"].kind == WORKLOADS["g2"].kind == "decode"
    assert (WORKLOADS["c3"].kind, WORKLOADS["c3"].num_requests, WORKLOADS["c3"].output_len) == (
        "chat",
        8,
        (64, 64),
    )


def test_c7_is_c4_on_an_agent_prompt():
    """C7 runs C4's file and paired rounds, on an 8,192-token prompt then 256 tokens, 2 rounds."""
    c4, c7 = WORKLOADS["c4"], select_workload("C7")
    assert (c7.kind, c7.num_requests, c7.input_len, c7.output_len, c7.rounds) == (
        "decode",
        1,
        (8192, 8192),
        (256, 256),
        2,
    )
    assert c7.random_gguf == c4.random_gguf and c7.isolated and c7.kv_bytes and not c4.kv_bytes
    assert c7.describe() == (
        "C7: agent prompt, CPU: 1 requests, prompt 8192, output 256 tokens, 2 paired rounds"
    )
    small = select_workload("c7", input_len="40", output_len="20", rounds=3)
    assert (small.input_len, small.output_len, small.rounds, small.kv_bytes) == (
        (40, 40),
        (20, 20),
        3,
        True,
    )
    with pytest.raises(InvalidParameterError, match="must be 1"):
        select_workload("c7", num_requests=2)
    with pytest.raises(InvalidParameterError, match=r"\(c4, c5, c7\), not c1"):
        select_workload("c1", rounds=2)


def test_overrides_and_ranges():
    assert parse_range("32:256", "input-len") == (32, 256)
    assert parse_range("7", "input-len") == (7, 7)
    workload = select_workload("C2", num_requests=3, input_len="4:9", output_len="5")
    assert (workload.num_requests, workload.input_len, workload.output_len) == (3, (4, 9), (5, 5))
    for bad in ("x", "1:2:3", "9:4", "0:3"):
        with pytest.raises(InvalidParameterError):
            select_workload("c2", input_len=bad)
    with pytest.raises(InvalidParameterError):
        select_workload("z9")
    with pytest.raises(InvalidParameterError):
        select_workload("c1", num_requests=4)


def test_random_requests_are_seeded_and_in_range():
    workload = select_workload("c2", num_requests=20, input_len="3:30", output_len="2:9")
    allowed = [i for i in range(1000) if i % 7]
    first = random_requests(workload, allowed, seed=0)
    assert first == random_requests(workload, allowed, seed=0)
    assert first != random_requests(workload, allowed, seed=1)
    allowed_set = set(allowed)
    for request in first:
        assert 3 <= len(request.prompt_token_ids) <= 30 and 2 <= request.output_len <= 9
        assert set(request.prompt_token_ids) <= allowed_set


def test_allowed_token_ids_skip_specials():
    class Tok:
        all_special_ids = (0, 2)
        added_tokens_decoder = MappingProxyType(
            {5: SimpleNamespace(special=True), 6: SimpleNamespace(special=False)}
        )

        def __len__(self):
            return 8

    assert allowed_token_ids(10, Tok()) == [1, 3, 4, 6, 7]
    assert allowed_token_ids(4) == [0, 1, 2, 3]


def _record(start, times, requested=None):
    return RequestRecord(
        prompt_len=10, requested_output_len=requested or len(times), start=start, token_times=times
    )


def test_figures_are_self_consistent():
    records = [
        _record(0.0, [1.0, 1.5, 2.0]),
        _record(0.0, [2.0, 3.0]),
        RequestRecord(5, 4, error="HTTP 500: boom"),
    ]
    fig = figures(RunResult("x", "x", records, duration=4.0), "throughput")
    assert (fig["requests"], fig["completed"], fig["failures"]) == (3, 2, 1)
    assert (fig["prompt_tokens"], fig["output_tokens"]) == (20, 5)
    assert fig["output_throughput"] == pytest.approx(5 / 4.0)
    assert fig["total_throughput"] == pytest.approx(25 / 4.0)
    assert fig["ttft_ms"]["mean"] == pytest.approx(1500.0)
    assert fig["tpot_ms"]["mean"] == pytest.approx(750.0)  # (500 + 1000) / 2
    assert fig["itl_ms"]["p50"] == pytest.approx(500.0)


def test_usage_count_overrides_chunks_for_tpot():
    record = _record(0.0, [1.0, 2.0, 3.0])
    record.num_output_tokens = 5  # five tokens in three chunks
    assert record.tpot == pytest.approx(0.5)


def test_decode_rate_skips_the_first_16_tokens():
    times = [float(i) for i in range(16)] + [15.0 + 0.5 * k for k in range(1, 41)]
    assert decode_tok_s(_record(0.0, times)) == pytest.approx(2.0)
    assert decode_tok_s(_record(0.0, times[:16])) is None


def test_ratio_direction():
    fast = {"output_throughput": 30.0, "turn_ttft_ms": [10.0, 20.0]}
    slow = {"output_throughput": 10.0, "turn_ttft_ms": [30.0, 80.0]}
    assert ratio(fast, slow, "throughput") == pytest.approx(3.0)
    assert ratio(fast, slow, "chat") == pytest.approx(4.0)  # last turn: 80 / 20
    assert headline(fast, "chat") == 20.0
    assert ratio(fast, {"output_throughput": None}, "throughput") is None


def test_parse_peers():
    assert parse_peers(["hf,llama-cpp", "llama.cpp"]) == ["hf", "llama.cpp"]
    assert parse_peers(None) == []
    with pytest.raises(InvalidParameterError):
        parse_peers(["vllm"])
