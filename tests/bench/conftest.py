"""A tiny C2-shaped mix shared by the offline and online end-to-end tests, and one
`localchat serve`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localchat.cli import app
from tests.serve_process import serve_process

TINY_MIX = ["--num-requests", "4", "--input-len", "8:40", "--output-len", "4:12", "--seed", "3"]
API_KEY = "bench-key"


@pytest.fixture(scope="module")
def module_cache_dir(tmp_path_factory):
    """A LOCALCHAT_CACHE_DIR of the module's own (random GGUF files and their converted
    tokenizers)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALCHAT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def run_bench(*args: str) -> str:
    """Run `localchat bench ARGS` in this process; returns its output, failing on a non-zero
    exit."""
    result = CliRunner().invoke(app, ["bench", "--no-progress", *args])
    assert result.exit_code == 0, f"exit {result.exit_code}:\n{result.output}\n{result.exception!r}"
    return result.output


def check_figures(fig: dict, *, requests: int) -> None:
    """Sane and self-consistent: every request answered in full, times positive, rates match
    counts."""
    assert fig["requests"] == fig["completed"] == requests and fig["failures"] == 0
    assert fig["output_tokens"] == fig["requested_output_tokens"] > 0
    assert fig["prompt_tokens"] > 0 and fig["duration_s"] > 0
    assert fig["output_throughput"] == pytest.approx(fig["output_tokens"] / fig["duration_s"])
    assert fig["total_throughput"] == pytest.approx(
        (fig["prompt_tokens"] + fig["output_tokens"]) / fig["duration_s"]
    )
    for key in ("ttft_ms", "tpot_ms"):
        stats = fig[key]
        assert 0 < stats["p50"] <= stats["p99"] and stats["mean"] > 0, (key, stats)
    assert fig["ttft_ms"]["p99"] <= fig["duration_s"] * 1000


@pytest.fixture(scope="session")
def offline_json(default_gguf, tmp_path_factory):
    """The tiny mix offline with the HF peer (and llama.cpp when installed), as a --json file."""
    path = tmp_path_factory.mktemp("bench") / "offline.json"
    peers = "hf,llama-cpp" if _has_llama_cpp() else "hf"
    output = run_bench(*TINY_MIX, "--compare", peers, "--json", str(path))
    return path, json.loads(path.read_text()), output


def _has_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def bench_server(default_gguf, tmp_path_factory):
    """`localchat serve` on a free port with an API key; stopped with SIGTERM at the end."""
    log_path = tmp_path_factory.mktemp("bench-serve") / "serve.log"
    with serve_process(
        log_path,
        "--max-model-len",
        "512",
        "--kv-cache-memory",
        "128MiB",
        "--grace-period",
        "5",
        api_key=API_KEY,
    ) as server:
        yield server.base_url
