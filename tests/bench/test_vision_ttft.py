"""benchmarks/vision_ttft.py on its tiny pair, in this process: the files are a Gemma 3 text GGUF
and an f16 mmproj localchat reads as llama.cpp's converter writes them, a localchat round gives a
TTFT with the encoder's share and a reply of the asked length, and where llama-cpp-python is
installed (an extra) its mtmd path runs the same pair on the same prompt tokens."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from localchat.bench.peer_llama_cpp import llama_cpp_available
from localchat.engine.loading.mmproj import read_mmproj
from localchat.models.gguf_header import read_header

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vision_ttft.py"
PICTURE = 64  # scaled to the tiny tower's 224 pixels by both systems


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vision_ttft", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:  # its dataclasses look their module up
        patch.setitem(sys.modules, "vision_ttft", module)
        spec.loader.exec_module(module)
        yield module


@pytest.fixture(scope="module")
def pair(bench, module_cache_dir, tmp_path_factory):
    return bench.ensure_pair(tmp_path_factory.mktemp("pair"), bench.pair_shape(tiny=True), "q4_k_m")


def _spec(bench, pair, system: str):
    text, mmproj = pair
    return bench.VisionSpec(
        system, str(text), 2, 128, mmproj=str(mmproj), picture_size=PICTURE, max_tokens=3
    )


def test_the_tiny_pair_is_gemma3s(bench, pair):
    text, mmproj = pair
    header = read_header(text)
    assert header.metadata["general.architecture"] == "gemma3"
    assert header.arch_field("attention.sliding_window") == 64
    assert header.arch_field("attention.key_length") == 128
    encoder = read_mmproj(mmproj)
    assert (encoder.projector, encoder.projection_dim) == ("gemma3", 256)
    assert encoder.tokens_per_image == bench.pair_shape(tiny=True).vision.tokens_per_image == 16


@pytest.fixture(scope="module")
def localchat_round(bench, pair):
    system = bench.LocalchatVision(_spec(bench, pair, "localchat"))
    return system.call({"picture": 0})


def test_a_localchat_round(localchat_round):
    result = localchat_round
    assert result["prompt"].count(None) == 16
    assert result["question_tokens"] == 32
    assert len(result["reply"]) == 3
    assert 0 < result["encode_s"] < result["ttft_s"] <= result["total_s"]
    assert result["cached_tokens"] == 0


def test_llama_cpp_runs_the_same_prompt(bench, pair, localchat_round):
    pytest.importorskip("llama_cpp.mtmd_cpp", reason="llama-cpp-python (an extra) is not installed")
    result = bench.LlamaCppVision(_spec(bench, pair, "llama.cpp")).call({"picture": 0})
    assert result["prompt"] == localchat_round["prompt"]
    assert result["question_tokens"] == 32
    assert len(result["reply"]) == 3
    assert 0 < result["encode_s"] < result["ttft_s"] <= result["total_s"]


@pytest.mark.slow  # two processes of their own, each loading its system
def test_paired_rounds_in_processes_of_their_own(bench, pair, tmp_path, capsys):
    text, mmproj = pair
    out = tmp_path / "vision.json"
    args = ["--text", str(text), "--mmproj", str(mmproj), "--rounds", "2", "--max-tokens", "1"]
    assert bench.main([*args, "--picture-size", str(PICTURE), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    systems = ["localchat", "llama.cpp"] if llama_cpp_available() else ["localchat"]
    assert list(summary["results"]) == systems
    for system in systems:
        fig = summary["results"][system]
        assert len(fig["ttft_ms"]) == len(fig["encode_ms"]) == 2 and fig["load_s"] > 0
        assert fig["prompt_tokens"] == summary["image_tokens"] + 54  # the template's, question's
    assert [r["order"] for r in summary["rounds"]] == [systems, systems[::-1]]
    if len(systems) == 2:
        assert summary["prompts_identical"] and len(summary["ratios"]) == 2
        assert "TTFT localchat / llama.cpp: median" in capsys.readouterr().out
    else:
        assert summary["median_ratio"] is None and "llama.cpp skipped" in summary["notes"][0]
