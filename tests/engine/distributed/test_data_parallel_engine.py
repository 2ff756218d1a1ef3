"""DataParallelEngine from Python, as an EngineClient: two real replica processes on a tiny random
model stream `generate`'s deltas (the greedy tokens of one AsyncEngine), a loop left early aborts
its request, and only data parallelism has per-replica metric families (on /metrics too)."""

from __future__ import annotations

import asyncio

import pytest

from localchat import AsyncEngine, EngineConfig, SamplingParams
from localchat.engine.distributed.data_parallel import DataParallelEngine
from localchat.server.metrics import ServerMetrics

pytestmark = pytest.mark.timeout(180)

ENGINE = dict(max_model_len=256, kv_cache_memory="4MiB", block_size=8, max_num_seqs=2)
PROMPTS = [[(7 * i + j) % 500 + 1 for j in range(12 + 5 * i)] for i in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
# prompt lookup drafts 3, 4, 1, ... after these (one per block-distinct prefix, for the router)
REPEATING = [[40 + 9 * i, 1, 2, 3, 4] * 4 + [1, 2] for i in range(4)]


async def tokens_of(engine: AsyncEngine | DataParallelEngine, prompt: list[int]) -> list[int]:
    tokens: list[int] = []
    async for delta in engine.generate(prompt, GREEDY):
        tokens += delta.outputs[0].token_ids
    return tokens


def samples(engine: DataParallelEngine, name: str) -> list[tuple[dict[str, str], float]]:
    """The labels and value of each sample of the replica family `localchat_replica_<name>`."""
    (family,) = (f for f in engine.replica_metrics() if f.name == f"localchat_replica_{name}")
    return [(sample.labels, sample.value) for sample in family.samples]


def samples_of(engine: DataParallelEngine) -> list[int]:
    """Each replica's drafted tokens."""
    return [s.spec_draft_tokens_total if s else 0 for s in engine.replica_stats()]


def in_flight(engine: DataParallelEngine) -> list[float]:
    return [value for _, value in samples(engine, "requests_in_flight")]


async def test_generate_on_two_replicas_and_leaving_early_aborts(tiny_qwen3):
    single = await AsyncEngine(EngineConfig.from_kwargs(model=tiny_qwen3, **ENGINE)).start()
    try:
        expected = [await tokens_of(single, p) for p in PROMPTS]
        repeating = [await tokens_of(single, p) for p in REPEATING]
        assert list(single.replica_metrics()) == []  # one engine: no per-replica series
        assert b"localchat_replica_" not in ServerMetrics(single).render()
    finally:
        await single.shutdown()

    config = EngineConfig.from_kwargs(model=tiny_qwen3, num_threads=1, **ENGINE)
    engine = await DataParallelEngine(config, 2).start()
    try:
        got = await asyncio.gather(*(tokens_of(engine, p) for p in PROMPTS))
        assert got == expected and all(len(t) == GREEDY.max_tokens for t in got)
        routed = {labels["replica"] for labels, _ in samples(engine, "routed_requests")}
        assert routed == {"0", "1"}  # both replicas served
        assert [value for _, value in samples(engine, "up")] == [1, 1]
        assert b'localchat_replica_up{replica="1"} 1.0' in ServerMetrics(engine).render()

        endless = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
        async for _ in engine.generate(PROMPTS[0], endless):
            break  # after the first delta: leaving the loop aborts the request
        for _ in range(100):
            if in_flight(engine) == [0, 0]:
                break
            await asyncio.sleep(0.05)
        assert in_flight(engine) == [0, 0], "leaving generate early left its request running"
        stats = engine.stats()  # as of the step that ended it
        assert stats is not None and stats.generation_tokens_total < 4 * GREEDY.max_tokens + 240

        # speculation turned on for every replica: the same tokens, drafted on both
        engine.set_speculative({"method": "ngram", "num_speculative_tokens": 3})
        got = await asyncio.gather(*(tokens_of(engine, p) for p in REPEATING))
        assert got == repeating
        drafted = samples_of(engine)
        assert all(value > 0 for value in drafted), drafted
    finally:
        await engine.shutdown()
