"""LLMEngine.embed on the float default model equals pooling transformers' final hidden states, in
one step or in prefill chunks; embeddings run in the scheduler's steps next to generation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from localchat.config import EngineConfig
from localchat.engine.core.async_engine import AsyncEngine
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import EmptyPromptError, InvalidParameterError

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "def fibonacci(n):", "Hi"]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_equals_a_direct_forward_pass(float_llm, hf_model, pooling):
    ids = [float_llm.engine.tokenize(text) for text in TEXTS]
    vectors = float_llm.engine.embed(ids, pooling)
    for token_ids, vector in zip(ids, vectors, strict=True):
        expected = _expected(hf_model, token_ids, pooling)
        torch.testing.assert_close(vector, expected, atol=2e-4, rtol=1e-3)
    # nothing stays allocated
    assert float_llm.engine.block_manager.usage == 0


def test_embed_rejects_unknown_pooling(float_llm):
    with pytest.raises(InvalidParameterError) as error:
        float_llm.engine.embed([[1, 2]], "max")
    assert error.value.param == "pooling"


def _expected(hf_model, token_ids: list[int], pooling: str) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(torch.tensor([token_ids]), output_hidden_states=True)
    hidden = out.hidden_states[-1][0]
    pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    return torch.nn.functional.normalize(pooled, dim=0)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_in_prefill_chunks_equals_a_direct_forward_pass(
    float_llm, hf_model, pooling, monkeypatch
):
    """A prompt longer than a step's token budget is prefilled in chunks; the pooled vector is the
    same as one forward pass over it."""
    engine = float_llm.engine
    monkeypatch.setattr(engine.scheduler, "max_num_batched_tokens", 5)
    ids = engine.tokenize("Paged attention splits the KV cache into fixed-size blocks of tokens.")
    assert len(ids) > 10
    steps = []
    run = engine.runner.run
    monkeypatch.setattr(engine.runner, "run", lambda batch: steps.append(batch) or run(batch))
    [vector] = engine.embed([ids], pooling)
    assert len(steps) == -(-len(ids) // 5)
    torch.testing.assert_close(vector, _expected(hf_model, ids, pooling), atol=2e-4, rtol=1e-3)
    assert engine.block_manager.usage == 0


def _generate(engine, request_id: str, prompt: list[int], during=None) -> list[int]:
    """Greedy tokens of one request, stepping the engine; `during()` runs after its second step."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    engine.add_request(request_id, prompt, params)
    tokens: list[int] = []
    steps = 0
    while engine.has_unfinished():
        for output in engine.step():
            assert output.request_id == request_id
            tokens += output.outputs[0].token_ids
        steps += 1
        if steps == 2 and during is not None:
            during()
    return tokens


def test_embeddings_share_the_steps_of_running_decodes(llm, monkeypatch):
    """embed() while a request decodes: the embeddings' prefill and the decode run in the same
    batches, the request's tokens are the ones it gets alone (none lost: those of the steps embed()
    ran come from the next step()), and the vectors are those computed alone."""
    engine = llm.engine
    prompt = engine.tokenize("Once upon a time")
    texts = ["The cat sat on the mat.", "A second, somewhat longer sentence to embed here.", "x"]
    ids = [engine.tokenize(text) for text in texts]
    alone_tokens = _generate(engine, "alone", prompt)
    alone_vectors = engine.embed(ids, "mean")
    batches = []
    run = engine.runner.run

    def spy(batch):
        batches.append([seq.request.pooling for seq in batch.seqs])
        return run(batch)

    monkeypatch.setattr(engine.runner, "run", spy)
    vectors = []
    tokens = _generate(engine, "busy", prompt, lambda: vectors.extend(engine.embed(ids, "mean")))
    assert tokens == alone_tokens
    assert any("mean" in kinds and None in kinds for kinds in batches), batches
    for vector, alone in zip(vectors, alone_vectors, strict=True):
        torch.testing.assert_close(vector, alone, atol=1e-4, rtol=1e-3)
    assert engine.block_manager.usage == 0 and not engine.requests


def test_add_embeddings_checks_every_prompt_first(llm):
    engine = llm.engine
    with pytest.raises(EmptyPromptError) as error:
        engine.add_embeddings(["a", "b"], [[1, 2], []], "last")
    assert error.value.param == "prompt" and not engine.requests
    with pytest.raises(InvalidParameterError, match="already in use"):
        engine.add_embeddings(["same", "same"], [[1, 2], [3]], "last")
    assert not engine.has_unfinished()


@pytest.mark.asyncio(loop_scope="session")
async def test_async_embeddings_beside_a_stream_and_cancelled(default_gguf):
    """AsyncEngine.embed: its requests run in the scheduler beside a stream; cancelling the call
    aborts them (nothing is left running), and the engine embeds on afterwards."""
    config = EngineConfig(max_model_len=1024, kv_cache_memory="64MiB", max_num_batched_tokens=64)
    engine = await AsyncEngine(config).start()
    try:
        long = engine.tokenize(" ".join(f"word{i}" for i in range(150)))
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        stream = await engine.add_request("Once upon a time", params)
        task = asyncio.create_task(engine.embed([long] * 8, "mean"))  # ~50 steps of 64 tokens
        while engine.stats().num_running < 2:  # the embeddings are being prefilled
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # aborted at the engine's next step, not computed on: within three of the stream's steps
        # (counted by the engine, not by the outputs the stream has queued since before the cancel)
        cancelled_at = engine.stats().generation_tokens_total
        async with asyncio.timeout(30):
            while engine.stats().generation_tokens_total < cancelled_at + 3:
                await asyncio.sleep(0.005)
        assert not [r for r in engine.engine.requests if r.startswith("embed-")]
        tokens = []
        async for output in stream:
            tokens += output.outputs[0].token_ids
        assert len(tokens) == 24
        while engine.stats().num_running or engine.stats().num_waiting:
            await asyncio.sleep(0.01)
        [vector] = await engine.embed([long[:50]], "last")
        assert len(vector) == 576  # SmolLM2-135M's hidden size
    finally:
        await engine.shutdown()


@pytest.mark.asyncio(loop_scope="session")
async def test_async_embeddings_are_prefilled_in_the_streams_steps(default_gguf, monkeypatch):
    """AsyncEngine.embed (what /v1/embeddings calls) beside a decoding stream: every step that
    prefills the embeddings decodes the stream too (the engine's own batches, not a clock), and
    the vectors are those computed alone."""
    config = EngineConfig(max_model_len=1024, kv_cache_memory="64MiB", max_num_batched_tokens=64)
    engine = await AsyncEngine(config).start()
    try:
        long = engine.tokenize(" ".join(f"word{i}" for i in range(150)))
        alone = await engine.embed([long], "mean")
        batches: list[list[str | None]] = []
        runner = engine.engine.runner
        run = runner.run

        def spy(batch):  # (in the engine thread)
            batches.append([seq.request.pooling for seq in batch.seqs])
            return run(batch)

        monkeypatch.setattr(runner, "run", spy)
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        stream = await engine.add_request("Once upon a time", params)
        tokens: list[int] = []

        async def read() -> None:
            async for output in stream:
                tokens.extend(output.outputs[0].token_ids)

        reader = asyncio.create_task(read())
        async with asyncio.timeout(60):
            while not tokens:  # the stream is decoding
                await asyncio.sleep(0.005)
        vectors = await engine.embed([long], "mean")
        with_embeddings = [kinds for kinds in batches if "mean" in kinds]
        # ~450 tokens at 63 a step beside the decode: 8 steps, each with it
        assert len(with_embeddings) >= len(long) // 64, batches
        assert all(None in kinds for kinds in with_embeddings), with_embeddings
        for vector, expected in zip(vectors, alone, strict=True):
            torch.testing.assert_close(
                torch.tensor(vector), torch.tensor(expected), atol=1e-4, rtol=0
            )
        await reader
        assert len(tokens) == 30
    finally:
        await engine.shutdown()
