"""AsyncEngine: streamed deltas, many concurrent consumers, cancellation frees blocks, clean
shutdown."""

from __future__ import annotations

import asyncio

import pytest

from localchat import AsyncEngine, EngineConfig, SamplingParams
from localchat.errors import (
    EmptyPromptError,
    EngineDeadError,
    InvalidParameterError,
    PromptTooLongError,
    QueueFullError,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def engine(default_gguf):
    engine = await AsyncEngine(EngineConfig(), max_waiting=64).start()
    yield engine
    await engine.shutdown()


async def collect(engine, prompt, params):
    text, token_ids, finish = "", [], None
    async for delta in engine.generate(prompt, params):
        for out in delta.outputs:
            text += out.text
            token_ids += out.token_ids
            finish = out.finish_reason or finish
    return text, token_ids, finish


async def wait_idle(engine):
    for _ in range(200):
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine not idle: {engine.stats()}")


async def test_streamed_deltas_add_up_to_the_offline_result(engine, llm):
    prompt = engine.render_chat([{"role": "user", "content": "Name three planets."}])
    params = SamplingParams(temperature=0, max_tokens=32)
    text, token_ids, finish = await collect(engine, prompt, params)
    offline = llm.generate([prompt], params)[0]
    assert (text, token_ids) == (offline.text, offline.token_ids) and finish == offline.outputs[
        0
    ].finish_reason


async def test_many_concurrent_consumers_get_what_each_prompt_gets_alone(engine, llm):
    prompts = [
        engine.render_chat([{"role": "user", "content": f"Count from {i} to {i + 5}."}])
        for i in range(12)
    ]
    params = SamplingParams(temperature=0, max_tokens=16)
    results = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
    for prompt, (text, token_ids, finish) in zip(prompts, results, strict=True):
        alone = llm.generate([prompt], params)[0]
        assert (text, token_ids, finish) == (
            alone.text,
            alone.token_ids,
            alone.outputs[0].finish_reason,
        )
    await wait_idle(engine)


async def test_leaving_early_or_cancelling_aborts_and_frees_blocks(engine):
    params = SamplingParams(max_tokens=2000, ignore_eos=True)
    async for _ in engine.generate("Write an endless story.", params):
        break  # leaving the loop closes the generator, which aborts the request
    await wait_idle(engine)

    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate("Another endless story.", params):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    assert engine.stats().num_running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(engine)


async def test_explicit_abort_ends_the_stream_with_abort(engine):
    stream = await engine.add_request(
        "Tell me everything.", SamplingParams(max_tokens=2000, ignore_eos=True)
    )
    reasons = []
    async for delta in stream:
        if not reasons:
            engine.abort(stream.request_id)
        reasons += [o.finish_reason for o in delta.outputs]
    assert reasons[-1] == "abort"
    await wait_idle(engine)


async def test_bad_requests_raise_before_any_output(engine):
    with pytest.raises(EmptyPromptError):
        await engine.add_request("", SamplingParams())
    with pytest.raises(PromptTooLongError, match="8192"):
        await engine.add_request([1] * 9000, SamplingParams())
    text, _, _ = await collect(
        engine, "Still serving?", SamplingParams(temperature=0, max_tokens=4)
    )
    assert text


async def test_a_grammar_that_fails_to_compile_raises_at_add_request(engine):
    """Acceptance waits for the grammar's compile: one llguidance rejects for this tokenizer (but
    not without it) raises here, not an abort after the stream began; a good one runs."""
    import llguidance

    bad = llguidance.LLMatcher.grammar_from_lark("start: <[99999999]>")
    with pytest.raises(InvalidParameterError, match="Token range") as error:
        await engine.add_request("x", SamplingParams(max_tokens=4, grammar=bad))
    assert error.value.param == "grammar"
    good = llguidance.LLMatcher.grammar_from_lark('start: "ok"')
    text, _, finish = await collect(engine, "x", SamplingParams(max_tokens=4, grammar=good))
    assert (text, finish) == ("ok", "stop")
    await wait_idle(engine)


async def test_a_grammar_past_its_compile_time_is_the_requests_400(engine, monkeypatch):
    """A compile for the tokenizer that runs past grammar_seconds ends its request with a 400
    (named `grammar`, which the server renames to its field); the engine serves on."""
    import threading

    import llguidance

    compiler = engine.engine.grammar_compiler
    release, build = threading.Event(), compiler._build
    monkeypatch.setattr(compiler, "_build", lambda g: release.wait(60) and build(g))
    monkeypatch.setenv("LOCALCHAT_LIMITS", "grammar_seconds=0.3")
    grammar = llguidance.LLMatcher.grammar_from_lark('start: "ok"')
    try:
        async with asyncio.timeout(30):
            with pytest.raises(InvalidParameterError) as error:
                await engine.add_request("x", SamplingParams(max_tokens=4, grammar=grammar))
    finally:
        release.set()
    assert error.value.param == "grammar"
    assert "did not compile within 0.3 s" in error.value.message
    monkeypatch.undo()
    text, _, finish = await collect(engine, "x", SamplingParams(max_tokens=4, grammar=grammar))
    assert (text, finish) == ("ok", "stop")
    await wait_idle(engine)


async def test_cancelling_an_add_that_waits_for_its_grammar_aborts_it(engine, monkeypatch):
    import threading

    import llguidance

    compiler = engine.engine.grammar_compiler
    release, build = threading.Event(), compiler._build
    monkeypatch.setattr(compiler, "_build", lambda g: release.wait(60) and build(g))
    grammar = llguidance.LLMatcher.grammar_from_lark("start: /[a-z ]+/")
    params = SamplingParams(grammar=grammar, max_tokens=4000, ignore_eos=True)  # minutes, if run
    add = asyncio.create_task(engine.add_request("x", params))
    async with asyncio.timeout(30):  # the engine thread has taken it: it waits for its grammar
        while engine.stats().num_waiting != 1:
            await asyncio.sleep(0.01)
    assert not add.done()
    add.cancel()
    with pytest.raises(asyncio.CancelledError):
        await add
    release.set()
    await wait_idle(engine)  # aborted in the engine, not left to run unread


async def test_waiting_queue_bound(default_gguf):
    small = await AsyncEngine(EngineConfig(max_num_seqs=1), max_waiting=1).start()
    try:  # one running, one waiting: the third is refused
        first = await small.add_request("one", SamplingParams(max_tokens=50, ignore_eos=True))
        second = await small.add_request("two", SamplingParams(max_tokens=50, ignore_eos=True))
        with pytest.raises(QueueFullError):
            await small.add_request("three", SamplingParams(max_tokens=5))
        await first.aclose()
        await second.aclose()
    finally:
        await small.shutdown()
    with pytest.raises(EngineDeadError):
        await small.add_request("after shutdown", SamplingParams())


async def test_the_queue_bound_counts_each_requests_sequences(default_gguf):
    """n sequences take n places: a request of n=3 fills a bound of 2 running + 2 waiting
    beside a request of one, and one of n=5 could never fit (a 400 naming n, not a 503)."""
    small = await AsyncEngine(EngineConfig(max_num_seqs=2), max_waiting=2).start()
    try:
        long = SamplingParams(max_tokens=50, ignore_eos=True)
        first = await small.add_request("one", long)
        three = await small.add_request(
            "three", SamplingParams(n=3, max_tokens=50, ignore_eos=True)
        )
        with pytest.raises(QueueFullError):
            await small.add_request("five", SamplingParams(max_tokens=5))
        with pytest.raises(InvalidParameterError) as refused:
            await small.add_request("too many", SamplingParams(n=5, max_tokens=5))
        assert refused.value.param == "n"
        await three.aclose()
        for _ in range(500):  # its places come back once the engine thread has aborted it
            if len(small._streams) == 1:
                break
            await asyncio.sleep(0.01)
        again = await small.add_request("after", SamplingParams(n=3, max_tokens=5))
        await again.aclose()
        await first.aclose()
    finally:
        await small.shutdown()


async def test_model_info_and_the_event_loops_own_tokenizer(engine, llm):
    info = engine.model_info
    assert (
        info.name == "SmolLM2-135M-Instruct"
        and info.source_kind == "gguf"
        and info.gguf_path.suffix == ".gguf"
    )
    assert info.vocab_size == llm.engine.runner.spec.vocab_size and info.max_model_len == 8192
    assert (
        info.eos_token_ids == tuple(sorted(llm.engine.eos_token_ids)) and info.load_format == "auto"
    )
    # the event loop never shares the engine thread's Rust tokenizer (concurrent use can fail
    # "Already borrowed")
    assert engine.tokenizer is not engine.engine.tokenizer
    assert engine.tokenizer._tokenizer is not engine.engine.tokenizer._tokenizer
    assert engine.tokenize("Hello world") == llm.engine.tokenize("Hello world")


async def test_a_stream_interval_holds_deltas_and_loses_none(engine):
    prompt = engine.render_chat([{"role": "user", "content": "Tell me about rivers."}])
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    text, token_ids, _ = await collect(engine, prompt, params)
    # an interval longer than the reply: the first token goes at once, the rest with the last
    stream = await engine.add_request(prompt, params, stream_interval=60.0)
    deltas, waiting = [], []
    async for delta in stream:
        deltas.append(delta)
        waiting.append(stream._stream.queue.qsize())
    assert "".join(d.outputs[0].text for d in deltas) == text
    assert [t for d in deltas for t in d.outputs[0].token_ids] == token_ids
    assert len(deltas[0].outputs[0].token_ids) == 1 and waiting[0] == 0
    assert waiting[1] == len(deltas) - 2  # all the others came in one hand-over
    assert deltas[-1].finished
    await wait_idle(engine)
