"""C4 plumbing on a tiny random file: each system in its own process, load time and peak RSS in the
JSON, failures and memory exhaustion reported as a system's failure, never as a traceback."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localchat import EngineConfig
from localchat.bench import isolated
from localchat.bench.big_model import bench_file, random_file_path
from localchat.bench.gguf_shapes import ModelShape
from localchat.bench.isolated_child import IsolatedSpec
from localchat.bench.random_gguf import write_random_gguf
from localchat.bench.workloads import WORKLOADS, BenchRequest
from localchat.cli import app
from tests.bench.conftest import _has_llama_cpp, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("module_cache_dir")]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, default_gguf):
    shape = ModelShape("tiny", "llama", 256, 2, 4, 2, 512)
    return write_random_gguf(tmp_path_factory.mktemp("c4") / "tiny-q4_k_m.gguf", shape, "q4_k_m")


def test_c4_is_the_design_workload():
    c4 = WORKLOADS["c4"]
    assert (c4.kind, c4.num_requests, c4.input_len, c4.output_len) == (
        "decode",
        1,
        (128, 128),
        (64, 64),
    )
    assert c4.random_gguf == ("llama-8b", "q4_k_m") and c4.isolated and c4.rounds == 4


def test_c4_end_to_end(tiny_file, tmp_path):
    """Both systems loaded once, then taking turns for three rounds on fresh requests of
    different lengths."""
    path = tmp_path / "c4.json"
    output = run_bench(
        "--workload",
        "c4",
        str(tiny_file),
        "--input-len",
        "16:40",  # with seed 3 the rounds' prompts are 23, 23 and 35 tokens: the context
        "--seed",  # both systems get holds the longest round's, not the first's
        "3",
        "--output-len",
        "20",
        "--rounds",
        "3",
        "--json",
        str(path),
    )
    payload = json.loads(path.read_text())
    systems = ["localchat", "llama.cpp"] if _has_llama_cpp() else ["localchat"]
    assert list(payload["results"]) == systems and payload["workload"]["rounds"] == 3
    for fig in payload["results"].values():
        assert fig["failures"] == 0 and (fig["prompt_tokens"], fig["output_tokens"]) == (81, 60)
        assert fig["decode_tok_s"] > 0 and fig["ttft_ms"]["mean"] > 0 and fig["load_s"] > 0
        assert 0 < fig["rss_before_load_mib"] < fig["peak_rss_mib"]
        if sys.platform == "linux":  # the split is taken while the model is still loaded
            # VmHWM is updated lazily by the kernel: it may trail the current RSS by a few pages
            assert (
                0 < fig["rss_anon_end_mib"] + fig["rss_file_end_mib"] <= fig["peak_rss_mib"] * 1.05
            )
            assert fig["rss_anon_end_mib"] + fig["rss_file_end_mib"] > fig["rss_before_load_mib"]
        assert [r["round"] for r in fig["rounds"]] == [1, 2, 3]
        speeds = sorted(r["decode_tok_s"] for r in fig["rounds"])
        assert fig["decode_tok_s"] == pytest.approx(speeds[1])  # the median round
        assert all(r["ttft_ms"] > 0 for r in fig["rounds"])
        if len(os.sched_getaffinity(0)) >= 2:  # where the host put two CPUs, around each run
            for r in fig["rounds"]:
                assert (
                    r["core_round_trip_ns"]["before"] > 0 and r["core_round_trip_ns"]["after"] > 0
                )
    flat = " ".join(output.split())  # the report wraps at the terminal's width
    assert "peak RSS" in flat and str(tiny_file) in output and "3 paired rounds" in flat
    if len(systems) == 2:
        ours, peer = (payload["results"][s]["rounds"] for s in systems)
        assert [r["ran_first"] for r in ours] == [True, False, True]  # the order alternates
        assert [r["ran_first"] for r in peer] == [False, True, False]
        paired = sorted(
            a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(ours, peer, strict=True)
        )
        assert payload["ratios"]["localchat/llama.cpp"] == pytest.approx(paired[1])
        assert any(note.startswith("localchat / llama.cpp") for note in payload["notes"])
        assert any(note.startswith("round 2 (llama.cpp first)") for note in payload["notes"])
    else:
        assert any("llama.cpp skipped" in note for note in payload["notes"])


def test_c7_end_to_end(tiny_file, tmp_path):
    """C7 is C4's machinery: two paired rounds by default (here on a short prompt), with the KV
    figures of the run's context in the report and the JSON, and the TTFT ratio beside decode's."""
    path = tmp_path / "c7.json"
    output = run_bench(
        "--workload",
        "c7",
        str(tiny_file),
        "--input-len",
        "40",
        "--output-len",
        "20",
        "--kv-cache-dtype",
        "q8_0",
        "--json",
        str(path),
    )
    payload = json.loads(path.read_text())
    systems = ["localchat", "llama.cpp"] if _has_llama_cpp() else ["localchat"]
    assert list(payload["results"]) == systems and payload["workload"]["rounds"] == 2
    for fig in payload["results"].values():
        assert fig["failures"] == 0 and (fig["prompt_tokens"], fig["output_tokens"]) == (80, 40)
        assert [r["round"] for r in fig["rounds"]] == [1, 2]
    assert "KV cache q8_0" in payload["results"]["localchat"]["label"]
    # the tiny file: 2 layers, 2 KV heads of 64; a round's context is 40 + 20 tokens
    float16 = 2 * 2 * 2 * 64 * 2 * 60
    assert payload["kv_cache"] == {
        "tokens": 60,
        "layers": 2,
        "kv_heads": 2,
        "head_dim": 64,
        "kv_cache_dtype_flag": "q8_0",
        "run_dtype": "q8_0",
        "run_bytes": float16 * 34 // 64,
        "run_over_float16": pytest.approx(34 / 64),
        "float16_bytes": float16,
        "q8_0_bytes": float16 * 34 // 64,
        "q8_0_over_float16": pytest.approx(34 / 64),
        "q8_0_over_float16_max": 0.55,
    }
    flat = " ".join(output.split())
    assert "2 paired rounds" in flat and "the run used --kv-cache-dtype q8_0" in flat
    if len(systems) == 2:
        ours, peer = (payload["results"][s]["rounds"] for s in systems)
        ttfts = [a["ttft_ms"] / b["ttft_ms"] for a, b in zip(ours, peer, strict=True)]
        decodes = [a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(ours, peer, strict=True)]
        # ours / the peer's both: decode above 1 is faster, TTFT below 1 is
        assert payload["ttft_ratios"]["localchat/llama.cpp"] == pytest.approx(sum(ttfts) / 2)
        assert payload["ratios"]["localchat/llama.cpp"] == pytest.approx(sum(decodes) / 2)
        assert "TTFT" in flat and "median of 2 rounds' ratios" in flat


def test_the_kv_shape_comes_from_the_gguf_header(tiny_file):
    from localchat.bench.kv_bytes import KVShape, gguf_kv_shape

    assert gguf_kv_shape(tiny_file) == KVShape(2, 2, 64)


def test_rounds_are_for_isolated_workloads_only():
    result = CliRunner().invoke(app, ["bench", "--no-progress", "-w", "c1", "--rounds", "2"])
    assert (
        result.exit_code != 0 and "--rounds" in result.output and "Traceback" not in result.output
    )
    result = CliRunner().invoke(app, ["bench", "--no-progress", "-w", "c4", "--rounds", "0"])
    assert result.exit_code != 0 and "--rounds must be >= 1" in result.output


def test_a_system_serves_several_rounds_and_reports_its_memory(tiny_file):
    system = isolated.IsolatedSystem(_spec(tiny_file), "localchat")
    assert system.start() and system.load_s > 0
    first = system.run([BenchRequest([100, 101, 102], 3)])
    second = system.run([BenchRequest([110, 111, 112, 113], 5)])
    memory = system.close()
    assert [len(r.records[0].token_times) for r in (first, second)] == [3, 5]
    assert system.error is None and memory["peak_rss_mib"] > memory["rss_before_load_mib"] > 0


def test_c4_refuses_the_hf_peer_and_a_non_gguf(tiny_file, tmp_path):
    result = CliRunner().invoke(
        app, ["bench", "--no-progress", "-w", "c4", str(tiny_file), "--compare", "hf"]
    )
    assert (
        result.exit_code != 0
        and "llama.cpp only" in result.output
        and "Traceback" not in result.output
    )
    result = CliRunner().invoke(app, ["bench", "--no-progress", "-w", "c4", str(tmp_path)])
    assert result.exit_code != 0 and "not one" in result.output


def _spec(path, system="localchat") -> IsolatedSpec:
    return IsolatedSpec(
        system,
        str(path),
        1,
        32,
        EngineConfig(max_model_len=64, kv_cache_memory="16MiB") if system == "localchat" else None,
    )


def test_a_failing_child_is_a_failed_result(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    result = isolated.run_isolated(_spec(junk), [BenchRequest([100, 101, 102], 3)], "localchat")
    assert result.records[0].error and result.records[0].token_times == []
    assert result.notes and result.notes[0].startswith("localchat: ")


def test_the_memory_guard_stops_the_child(tiny_file, monkeypatch):
    # "no memory left" from the first poll
    monkeypatch.setattr(isolated, "memory_floor", lambda: 1 << 60)
    result = isolated.run_isolated(_spec(tiny_file), [BenchRequest([1, 2], 3)], "localchat")
    assert "available memory fell below" in result.records[0].error


def test_a_child_that_dies_between_rounds_fails_its_later_rounds(tiny_file):
    system = isolated.IsolatedSystem(_spec(tiny_file), "localchat")
    assert system.start()
    assert system.run([BenchRequest([100, 101], 2)]).records[0].error is None
    system._process.kill()  # as the OOM killer or a crash would
    later = system.run([BenchRequest([100, 101], 2)])
    memory = system.close()
    assert later.records[0].error and "exit status" in later.records[0].error
    assert memory["load_s"] > 0 and memory["peak_rss_mib"] > 0  # the RSS polled while it lived


def test_the_random_file_is_made_once(tmp_path, default_gguf):
    workload = replace(WORKLOADS["c4"], random_gguf=("smollm2-135m", "q8_0"))
    assert random_file_path(workload) == Path(
        os.environ["LOCALCHAT_CACHE_DIR"], "bench", "random-smollm2-135m-q8_0-v1.gguf"
    )
    target = tmp_path / "made.gguf"
    path = bench_file(None, str(target), workload, show_progress=False)
    assert path == target and path.stat().st_size > 100 << 20
    mtime = path.stat().st_mtime_ns
    assert bench_file(None, str(target), workload, show_progress=False).stat().st_mtime_ns == mtime


def test_the_kv_pool_holds_the_peers_context(tiny_file):
    """C4 gives localchat's KV pool the tokens llama.cpp's n_ctx holds, in whole blocks."""
    from localchat.bench.big_model import kv_pool_bytes
    from localchat.engine.core.llm_engine import LLMEngine

    budget = kv_pool_bytes(tiny_file, 40, 16, 2)  # a GGUF's pool is float16 on the CPU
    engine = LLMEngine(EngineConfig(model=str(tiny_file), max_model_len=40, kv_cache_memory=budget))
    pool = engine.runner.kv_cache
    assert pool is not None and pool.shape[2] == 3  # ceil(40 / 16) blocks
    assert pool.numel() * pool.element_size() == budget
