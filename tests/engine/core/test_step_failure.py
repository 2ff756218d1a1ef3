"""A step whose forward raises ends only the requests of its batch, with an EngineStepError, and
frees their blocks; the blocks it never wrote leave the prefix cache; the engine serves on. The
fault is injected into a real engine on a tiny random model: its forward raises whenever the
batch's tokens hold the run POISON (three ids in a row: a prefill of a prompt with it, never
decodes, which have one token per sequence)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import torch

from localchat import LLM, AsyncEngine, SamplingParams
from localchat.engine.core.llm_engine import LLMEngine
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.step_failure import recoverable
from localchat.errors import EngineDeadError, EngineStepError

POISON = [301, 302, 303]
BLOCK = 8
ENGINE = dict(max_model_len=256, kv_cache_memory="4MiB", block_size=BLOCK, max_num_seqs=2)


@contextlib.contextmanager
def poisoned(engine: LLMEngine) -> Iterator[None]:
    """The model's forward raises while its batch's tokens hold POISON (as an out-of-memory
    would)."""
    model = engine.runner.model
    forward = model.forward
    marker = torch.tensor(POISON)

    def failing(input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.flatten().cpu()
        runs = ids.unfold(0, len(POISON), 1) if len(ids) >= len(POISON) else ids[:0, None]
        if bool((runs == marker).all(dim=1).any()):
            raise RuntimeError("injected fault: can't allocate memory")
        return forward(input_ids)

    model.forward = failing
    try:
        yield
    finally:
        del model.forward


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 37 + i * 11) % 250 + 3 for i in range(length)]


def _run_to_end(engine: LLMEngine) -> dict[str, RequestOutput]:
    outputs: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.request_id in outputs:
                outputs[delta.request_id].merge(delta)
            else:
                outputs[delta.request_id] = delta
    return outputs


def test_a_failed_step_ends_its_batch_and_the_engine_serves_on(tiny_qwen3):
    engine = LLM(tiny_qwen3, **ENGINE).engine
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prefix = _prompt(1, 3 * BLOCK)  # three full blocks, registered when the step is scheduled
    with poisoned(engine):
        engine.add_request("a", _prompt(2, 20), long)
        engine.step()  # a's prompt: a decodes from now on
        engine.add_request("b", [*prefix, *POISON, 5, 6], long)
        engine.add_request("c", _prompt(3, 20), long)  # waits: two sequences run at most
        with pytest.raises(EngineStepError, match=r"engine step .* failed .*injected fault") as err:
            engine.step()
        assert err.value.request_ids == ("a", "b") and err.value.http_status == 500
        assert set(engine.requests) == {"c"}
        stats = engine.stats()
        assert (stats.num_running, stats.num_waiting) == (0, 1)
        # b's prefix blocks hold keys its forward never wrote: no later prompt is served them
        engine.add_request("e", [*prefix, 9, 10, 11], long)
        outputs = _run_to_end(engine)
    assert set(outputs) == {"c", "e"}
    for output in outputs.values():
        assert output.finished and output.outputs[0].finish_reason == "length"
        assert len(output.outputs[0].token_ids) == 40
    assert outputs["e"].num_cached_tokens == 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # e's own blocks were written: the same prefix is now served from the cache
    engine.add_request("f", [*prefix, 12], SamplingParams(max_tokens=1))
    assert _run_to_end(engine)["f"].num_cached_tokens == 3 * BLOCK


async def test_the_async_engine_ends_the_failed_requests_and_serves_on(tiny_qwen3):
    engine = await AsyncEngine(max_waiting=8, **ENGINE, model=tiny_qwen3).start()
    try:
        assert engine.engine is not None
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        with poisoned(engine.engine):
            stream = await engine.add_request([*_prompt(4, 10), *POISON], params)
            with pytest.raises(EngineStepError, match="injected fault"):
                async for _ in stream:
                    pass
            with pytest.raises(EngineStepError):  # an embedding call fails whole
                await engine.embed([_prompt(5, 9), [*POISON, 7], _prompt(6, 30)], "last")
            assert not engine.is_dead
            tokens = []
            async for delta in engine.generate(_prompt(7, 10), params):
                tokens += delta.outputs[0].token_ids
            assert len(tokens) == 12
            vectors = await engine.embed([_prompt(5, 9), _prompt(6, 30)], "last")
            assert vectors.shape == (2, 64) and vectors.dtype == "float32"
        for _ in range(200):
            stats = engine.stats()
            if stats is not None and stats.num_running == stats.num_waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert stats is not None and stats.kv_cache_usage == 0.0
        assert engine.engine.block_manager.num_free_blocks == engine.engine.block_manager.num_blocks
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "error,tensor_parallel,survives",
    [
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), False, True),
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), False, True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False, False),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), True, False),
        (EngineDeadError("rank 1 exited"), False, False),
    ],
)
def test_which_failures_the_engine_survives(error, tensor_parallel, survives):
    assert recoverable(error, tensor_parallel) is survives
