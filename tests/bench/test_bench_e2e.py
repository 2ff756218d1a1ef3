"""End to end on the default model: a tiny offline run with its peers, a tiny chat run, and a tiny
online run against a real `localchat serve`, each checked for sane, self-consistent figures."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.bench.conftest import API_KEY, TINY_MIX, check_figures, run_bench

pytestmark = pytest.mark.slow


def test_offline_run_with_peers(offline_json):
    _, payload, output = offline_json
    assert payload["mode"] == "offline" and payload["command"].startswith("localchat bench")
    assert payload["workload"]["num_requests"] == 4 and payload["workload"]["seed"] == 3
    assert payload["machine"]["cpu_count"] >= 1 and payload["versions"]["torch"]
    results = payload["results"]
    assert "localchat" in results and "hf" in results
    for fig in results.values():
        check_figures(fig, requests=4)
    ours, hf = results["localchat"], results["hf"]
    # the same requests: same token counts on both sides
    assert (ours["prompt_tokens"], ours["output_tokens"]) == (
        hf["prompt_tokens"],
        hf["output_tokens"],
    )
    assert 0 < ours["peak_kv_cache_usage"] <= 1 and ours["num_preemptions"] == 0
    assert payload["ratios"]["localchat/hf"] > 0
    assert "Output tok/s" in output and "localchat vs hf" in output


def test_chat_workload_reuses_the_prefix(default_gguf, tmp_path):
    path = tmp_path / "chat.json"
    run_bench(
        "--workload",
        "c3",
        "--num-requests",
        "3",
        "--input-len",
        "24",
        "--output-len",
        "4",
        "--compare",
        "hf",
        "--json",
        str(path),
    )
    payload = json.loads(path.read_text())
    ours, hf = payload["results"]["localchat"], payload["results"]["hf"]
    for fig in (ours, hf):
        assert fig["requests"] == 3 and fig["output_tokens"] == 12 and fig["failures"] == 0
        assert len(fig["turn_ttft_ms"]) == 3 and all(t > 0 for t in fig["turn_ttft_ms"])
    assert ours["prompt_tokens"] == hf["prompt_tokens"]  # the peer re-reads exactly our prompts
    assert ours["prefix_cache_hit_rate"] > 0  # later turns start from the cached history
    assert payload["ratios"]["localchat/hf"] > 0


def test_decode_workload_reports_decode_rate(default_gguf, tmp_path):
    path = tmp_path / "decode.json"
    run_bench("--workload", "c1", "--input-len", "16", "--output-len", "24", "--json", str(path))
    fig = json.loads(path.read_text())["results"]["localchat"]
    check_figures(fig, requests=1)
    assert fig["output_tokens"] == 24 and fig["decode_tok_s"] > 0
    # the label says what ran: the GGUF's types and the KV cache's dtype
    assert "weights Q4_1 + Q8_0" in fig["label"] and "KV cache float16" in fig["label"]


def test_online_run_against_a_real_server(bench_server, offline_json, tmp_path):
    offline_path, offline_payload, _ = offline_json
    path = tmp_path / "online.json"
    output = run_bench(
        "--url",
        bench_server,
        "--api-key",
        API_KEY,
        *TINY_MIX,
        "--concurrency",
        "2",
        "--baseline",
        str(offline_path),
        "--json",
        str(path),
    )
    payload = json.loads(path.read_text())
    assert payload["mode"] == "online" and payload["workload"]["concurrency"] == 2
    server = payload["results"]["server"]
    check_figures(server, requests=4)
    assert server["itl_ms"]["mean"] > 0
    # the same requests as offline (same seed and tokenizer)
    offline = offline_payload["results"]["localchat"]
    assert (server["prompt_tokens"], server["output_tokens"]) == (
        offline["prompt_tokens"],
        offline["output_tokens"],
    )
    assert payload["ratios"]["server/offline"] > 0
    assert "server vs offline" in output


def test_online_poisson_rate_and_failures_counted(bench_server, tmp_path):
    """Prompts of 8 to 700 tokens against a server of 512: the one seed 3 draws too long for it
    (with its 3 output tokens) is refused (400), counted as a failure and left out of the
    figures, and the run goes on."""
    path = tmp_path / "rate.json"
    run_bench(
        "--url",
        bench_server,
        "--api-key",
        API_KEY,
        "--num-requests",
        "4",
        "--input-len",
        "8:700",
        "--output-len",
        "3",
        "--request-rate",
        "50",
        "--seed",
        "3",
        "--json",
        str(path),
    )
    fig = json.loads(path.read_text())["results"]["server"]
    assert (fig["requests"], fig["completed"], fig["failures"]) == (4, 3, 1)
    assert fig["output_tokens"] == 3 * 3 and fig["requested_output_tokens"] == 4 * 3
    assert 3 * 8 <= fig["prompt_tokens"] <= 3 * 509  # the completed ones' prompts only
    for key in ("ttft_ms", "tpot_ms"):
        assert 0 < fig[key]["p50"] <= fig[key]["p99"], (key, fig[key])


def test_online_wrong_key_is_a_clear_error(bench_server):
    from typer.testing import CliRunner

    from localchat.cli import app

    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--no-progress",
            "--url",
            bench_server,
            "--api-key",
            "wrong",
            "-n",
            "1",
            "--input-len",
            "4",
            "--output-len",
            "2",
        ],
    )
    assert result.exit_code == 2
    assert "error:" in result.output


def _token_counters(base_url: str) -> tuple[float, float]:
    """The server's prompt and generated tokens so far, from /metrics."""
    samples = {}
    key = {"Authorization": f"Bearer {API_KEY}"}  # /metrics takes the server's key
    for line in httpx.get(f"{base_url}/metrics", headers=key).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples["localchat_prompt_tokens_total"], samples["localchat_generation_tokens_total"]


@pytest.mark.parametrize(
    ("endpoint", "path"), [("messages", "/v1/messages"), ("responses", "/v1/responses")]
)
def test_online_text_endpoints_count_the_servers_tokens(bench_server, endpoint, path, tmp_path):
    """--endpoint messages / responses: the prompts go as text, the token counts are the usage the
    server reports, which its own counters confirm (less the one short test request first)."""
    json_path = tmp_path / f"{endpoint}.json"
    prompt_before, generated_before = _token_counters(bench_server)
    run_bench(
        "--url",
        bench_server,
        "--api-key",
        API_KEY,
        "--endpoint",
        endpoint,
        *TINY_MIX,
        "--concurrency",
        "2",
        "--json",
        str(json_path),
    )
    prompt_after, generated_after = _token_counters(bench_server)
    payload = json.loads(json_path.read_text())
    assert payload["workload"]["endpoint"] == endpoint
    fig = payload["results"]["server"]
    assert path in fig["label"]
    assert (fig["requests"], fig["completed"], fig["failures"]) == (4, 4, 0)
    # ignore_eos (localchat's extension on these endpoints): every requested token
    assert fig["output_tokens"] == fig["requested_output_tokens"]
    # the test request generated 1 or 2 tokens and read a short prompt in its chat template
    assert 1 <= generated_after - generated_before - fig["output_tokens"] <= 2
    assert 0 < prompt_after - prompt_before - fig["prompt_tokens"] < 100
    assert fig["ttft_ms"]["p50"] > 0 and fig["output_throughput"] > 0
