"""Tensor parallelism on the CPU over gloo: real spawned ranks, compared with one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.distributed.shard_plan import plan_shards
from localchat.engine.modeling.decoder import DecoderSpec
from localchat.errors import InvalidParameterError
from tests.serve_process import serve_process

MODELS = Path(__file__).parents[2] / "data" / "models"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# small enough that four prompts of up to 24 new tokens preempt one another
# 8 blocks of a float32 pool (a float16 one would round the ranks' last-bit differences in k and v
# too, which the logits check below does not allow for)
SMALL = {
    "kv_cache_memory": "6MiB",
    "kv_cache_dtype": "float32",
    "max_model_len": 128,
    "max_num_batched_tokens": 64,
}
PREFIX = "You are a helpful assistant. Answer every question in one short sentence. " * 2
PROMPTS = [
    PREFIX + "What is the capital of France?",
    PREFIX + "Why is the sky blue?",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
]


# 8 query heads and 2 KV heads: splits over 2 or 4 ranks
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1001,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def _greedy_run(llm: LLM) -> tuple[list[list[int]], int]:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    return [o.outputs[0].token_ids for o in outputs], llm.engine.stats().num_preemptions


def _close(llm: LLM) -> None:
    llm.engine.runner.close()


@pytest.fixture(scope="module")
def one_rank_run(default_gguf):
    llm = LLM(**SMALL)
    tokens, preemptions = _greedy_run(llm)
    logits = llm.engine.prompt_logits(llm.engine.tokenize(PROMPTS[0]))
    return tokens, preemptions, logits


def test_tp3_greedy_tokens_equal_one_rank_for_a_mixed_batch(one_rank_run):
    """Chunked prefills, decodes, a shared prefix and preemption in one run, on 3 ranks."""
    tokens, preemptions, logits = one_rank_run
    llm = LLM(tensor_parallel_size=3, **SMALL)
    try:
        tp_tokens, tp_preemptions = _greedy_run(llm)
        tp_logits = llm.engine.prompt_logits(llm.engine.tokenize(PROMPTS[0]))
        stats = llm.engine.stats()
    finally:
        _close(llm)
    assert preemptions > 0 and tp_preemptions > 0
    assert stats.prefix_cache_hits > 0
    assert tp_tokens == tokens
    # Not bit for bit: the all-reduces add the ranks' partial sums in another order than one
    # matmul does (1.3e-4 at most on the dequantized weights), and each projection's activations
    # are quantized per 32 values, which turns such last-bit differences into code flips (9e-3 at
    # most on logits up to 31 here). The greedy tokens above are equal all the same.
    assert torch.allclose(tp_logits, logits, atol=2e-2, rtol=0)
    assert torch.equal(tp_logits.argmax(dim=-1), logits.argmax(dim=-1))


def test_tp2_on_the_default_model_is_refused_with_the_head_counts(default_gguf):
    with pytest.raises(InvalidParameterError, match="9 query heads and 3 KV heads"):
        LLM(tensor_parallel_size=2)


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    spec = DecoderSpec(1001, 256, 512, 2, 8, 2, 32, 1e-6, False)
    plans = [plan_shards(spec, rank, 4) for rank in range(4)]
    assert [p.q_heads for p in plans] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert [p.kv_heads for p in plans] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [p.vocab for p in plans][-1] == range(753, 1001)


def _dummy_runs(config_dir, size: int, prompts: list[list[int]]):
    """Greedy tokens and the first prompt's logits, random weights from `config_dir`, at TP=1 and
    TP=`size`."""
    options = {"load_format": "dummy", "kv_cache_memory": "16MiB", "max_num_batched_tokens": 32}
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = []
    for tp in (1, size):
        llm = LLM(str(config_dir), tensor_parallel_size=tp, max_model_len=128, **options)
        try:
            tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            results.append((tokens, llm.engine.prompt_logits(prompts[0])))
        finally:
            if tp > 1:
                _close(llm)
    return results


def test_tiny_random_model_at_tp4_matches_one_rank(tmp_path):
    """8 query heads, 2 KV heads on 4 ranks (each KV head on two), an uneven vocabulary."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    prompts = [[5, 17, 900, 3, 42, 1000, 7] * 6, [11, 12, 13], [999]]
    (tokens, logits), (tp_tokens, tp_logits) = _dummy_runs(tmp_path, 4, prompts)
    assert tp_tokens == tokens
    assert torch.allclose(tp_logits, logits, atol=1e-4, rtol=0)


def test_qwen2_shape_at_tp2_gives_logits_within_1e4(tmp_path):
    """Qwen2.5-0.5B's shape (14 heads, 2 KV heads, q/k/v bias, tied embeddings), 4 of its layers,
    its vocabulary cut to 4,099 (the full one's float32 embedding, 545 MB, cost 40 s of the run)."""
    config = json.loads((MODELS / "qwen2.5-0.5b" / "config.json").read_text())
    config["num_hidden_layers"] = 4
    config["vocab_size"] = 4099  # odd: the two ranks' vocabulary shards differ in size
    (tmp_path / "config.json").write_text(json.dumps(config))
    prompts = [[3707, 11, 1879, 0, 4098, 42] * 5, [100, 200]]
    (tokens, logits), (tp_tokens, tp_logits) = _dummy_runs(tmp_path, 2, prompts)
    assert tp_tokens == tokens
    assert torch.allclose(tp_logits, logits, atol=1e-4, rtol=0)


def _generate(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "localchat", "generate", "-t", "0", "-n", "24", *flags]
    command += ["--kv-cache-memory", "64MiB", "--max-model-len", "1024", "Name three colors."]
    return subprocess.run(command, capture_output=True, text=True, timeout=240)


def test_generate_prints_the_same_text_at_tp3(default_gguf):
    plain = _generate()
    parallel = _generate("--tensor-parallel-size", "3")
    assert plain.returncode == 0 and parallel.returncode == 0, parallel.stderr
    assert plain.stdout.strip() and parallel.stdout == plain.stdout


def _ranks(pid: int) -> list[psutil.Process]:
    """The spawned tensor-parallel ranks of process `pid` (not its resource tracker)."""
    children = psutil.Process(pid).children()
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "hangs"])
def test_a_dead_or_hung_rank_is_a_clean_error_and_a_nonzero_exit(default_gguf, how):
    command = [sys.executable, "-m", "localchat", "generate", "--raw", "-t", "0", "-n", "1000"]
    command += ["-tp", "3", "--kv-cache-memory", "64MiB", "--max-model-len", "1024", "1, 2, 3,"]
    env = {**os.environ, "LOCALCHAT_TP_TIMEOUT": "10"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        process.stdout.read(8)  # tokens are flowing: every rank is in the middle of the request
        ranks = _ranks(process.pid)
        assert len(ranks) == 2
        started = time.monotonic()
        os.kill(ranks[-1].pid, how)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode not in (0, None)
    assert time.monotonic() - started < 60
    assert b"tensor-parallel group failed" in stderr and b"Traceback" not in stderr
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks)


def test_the_server_fails_the_stream_and_turns_unhealthy_when_a_rank_dies(
    default_gguf, tmp_path, monkeypatch
):
    """Idle longer than the collective timeout first: idle ranks wait on their pipes, not in a
    collective, so the next request is served; then a rank dies mid-stream."""
    monkeypatch.setenv("LOCALCHAT_TP_TIMEOUT", "8")
    args = ("-tp", "3", "--kv-cache-memory", "64MiB", "--max-model-len", "1024")
    with serve_process(tmp_path / "serve.log", *args) as server:
        short = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
        for pause in (0, 10):
            time.sleep(pause)
            reply = httpx.post(f"{server.base_url}/v1/completions", json=short, timeout=60)
            assert reply.status_code == 200, reply.text
        body = {"prompt": "1, 2, 3,", "max_tokens": 900, "temperature": 0, "stream": True}
        events = []
        with httpx.stream(
            "POST", f"{server.base_url}/v1/completions", json=body, timeout=120
        ) as response:
            for line in response.iter_lines():
                events.append(line)
                if len(events) == 4:  # streaming: kill a rank mid-request
                    os.kill(_ranks(server.process.pid)[0].pid, signal.SIGKILL)
        assert any("tensor-parallel group failed" in e for e in events[4:])
        health = httpx.get(f"{server.base_url}/health", timeout=10)
        assert health.status_code == 503


@pytest.mark.parametrize(
    ("how", "detail"),
    [
        (signal.SIGKILL, "tensor-parallel group failed: rank 2 exited"),
        (signal.SIGSTOP, "rank 2 did not answer a health ping within 3 s (hung)"),
    ],
    ids=["dies", "hangs"],
)
def test_an_idle_server_turns_unhealthy_when_a_rank_dies_or_hangs(
    default_gguf, tmp_path, monkeypatch, how, detail
):
    """No request runs, so no collective notices: the engine's idle health check does (a dead
    rank by its exit, a hung one by a ping it does not answer)."""
    monkeypatch.setenv("LOCALCHAT_TP_PING_TIMEOUT", "3")
    args = ("-tp", "3", "--kv-cache-memory", "64MiB", "--max-model-len", "1024")
    with serve_process(tmp_path / "serve.log", *args) as server:
        time.sleep(5)  # idle pings answered meanwhile: healthy
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
        rank = _ranks(server.process.pid)[1]
        os.kill(rank.pid, how)
        deadline = time.monotonic() + 20
        while (health := httpx.get(f"{server.base_url}/health", timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "still healthy 20 s after a rank died or hung"
            time.sleep(0.2)
        assert health.status_code == 503
        assert detail in health.json()["detail"]
        deadline = time.monotonic() + 20  # the group is torn down: the hung rank is killed
        while rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the hung rank is still there"
            time.sleep(0.2)
        short = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{server.base_url}/v1/completions", json=short, timeout=30)
        assert reply.status_code == 503


RESPONSE_FORMATS = [
    {"type": "json_object"},
    {
        "type": "json_schema",
        "json_schema": {
            "name": "person",
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"],
            },
        },
    },
]


def test_a_constrained_request_at_tp3_gives_the_json_of_one_rank(default_gguf):
    """The grammar masks the logits on rank 0, where sampling happens: the same valid JSON, for a
    json_object and a json_schema response format (one engine of each size for both)."""
    from localchat.server.structured import response_format_grammar

    ask = "Return a JSON object with the keys name and age for a person called Ann, aged 30."
    messages = [{"role": "user", "content": ask}]
    grammars = [response_format_grammar(response_format) for response_format in RESPONSE_FORMATS]
    assert all(grammar is not None for grammar in grammars)
    texts: dict[int, list[str]] = {}
    for tp in (1, 3):
        llm = LLM(tensor_parallel_size=tp, kv_cache_memory="64MiB", max_model_len=1024)
        try:
            for grammar in grammars:
                params = SamplingParams(temperature=0, max_tokens=96, grammar=grammar)
                output = llm.generate([llm.render_chat(messages)], params)[0].outputs[0]
                assert output.finish_reason == "stop", output.text  # a whole JSON value
                texts.setdefault(tp, []).append(output.text)
        finally:
            if tp > 1:
                _close(llm)
    assert texts[1] == texts[3]
    for response_format, text in zip(RESPONSE_FORMATS, texts[3], strict=True):
        value = json.loads(text)
        assert isinstance(value, dict)
        if response_format["type"] == "json_schema":
            assert isinstance(value["name"], str) and isinstance(value["age"], int)
