"""Our engine, driven by a loop over `LLMEngine.step()` so every output token is timed as a caller
sees it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest

Advance = Callable[[int], None]


def _noop(_: int) -> None:
    pass


@dataclass(frozen=True)
class ModelTarget:
    """What the peers need to run the same model the engine ran (so the engine can be freed
    first)."""

    name: str
    directory: Path  # HF-style directory (for a GGUF model: its converted float32 copy)
    gguf_path: Path | None
    load_format: str
    device: str
    dtype: object  # torch.dtype
    num_threads: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int


def model_target(engine) -> ModelTarget:
    import torch

    info = engine.model_info
    eos = info.eos_token_ids
    tokenizer = engine.tokenizer
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    if pad is None:
        pad = eos[0] if eos else 0
    return ModelTarget(
        info.name,
        info.config_dir,
        info.gguf_path,
        info.load_format,
        info.device,
        info.dtype,
        torch.get_num_threads(),
        info.max_model_len,
        eos,
        pad,
    )


def engine_label(engine) -> str:
    runtime = engine.runtime
    prefix = "on" if runtime.config.enable_prefix_caching else "off"
    from localchat.engine.modeling.weights import describe_weights
    from localchat.kernels.kv_quant import kv_dtype_name
    from localchat.utils import format_bytes

    # the pool's real bytes (a q8_0 row's scales included)
    pool = engine.runner.bytes_per_block() * engine.block_manager.num_blocks
    return (
        f"localchat engine (weights {describe_weights(runtime.model)}, activations "
        f"{str(runtime.dtype).removeprefix('torch.')}, "
        f"KV cache {kv_dtype_name(runtime.kv_cache_dtype)} ({format_bytes(pool)}), "
        f"{runtime.device.type}, "
        f"max_num_seqs {runtime.max_num_seqs}, "
        f"max_num_batched_tokens {runtime.max_num_batched_tokens}, "
        f"prefix caching {prefix})"
    )


def _greedy(max_tokens: int):
    from localchat.engine.sampling.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def warm_up(engine, token_ids: list[int]) -> None:
    """One short request so first-call costs (allocations, kernel selection) stay out of the
    timings."""
    engine.add_request("bench-warmup", token_ids[:8] or [0], _greedy(4))
    while engine.has_unfinished():
        engine.step()


def run_engine(engine, requests: list[BenchRequest], advance: Advance = _noop) -> RunResult:
    """All requests arrive at once; returns per-request token times and the engine's cache
    figures."""
    before = engine.stats()
    records = [RequestRecord(len(r.prompt_token_ids), r.output_len) for r in requests]
    peak_usage = 0.0
    start = time.perf_counter()
    try:
        for index, request in enumerate(requests):
            engine.add_request(
                f"bench-{index}", request.prompt_token_ids, _greedy(request.output_len)
            )
            records[index].start = start
        while engine.has_unfinished():
            outputs = engine.step()
            now = time.perf_counter()
            peak_usage = max(peak_usage, engine.stats().kv_cache_usage)
            for output in outputs:
                count = output.num_output_tokens
                records[int(output.request_id.rsplit("-", 1)[1])].token_times.extend([now] * count)
                advance(count)
    except BaseException:
        for index in range(len(requests)):
            engine.abort(f"bench-{index}")
        raise
    duration = time.perf_counter() - start
    return RunResult(
        "localchat",
        engine_label(engine),
        records,
        duration,
        _engine_figures(engine, before, peak_usage),
    )


def _engine_figures(engine, before, peak_usage: float) -> dict:
    after = engine.stats()
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    return {
        "peak_kv_cache_usage": peak_usage,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "num_preemptions": after.num_preemptions - before.num_preemptions,
        "kv_cache_blocks": after.num_blocks,
    }


def run_engine_chat(
    engine, user_messages: list[str], reply_len: int, advance: Advance = _noop
) -> tuple[RunResult, list[list[int]]]:
    """One conversation, a turn at a time: each turn's prompt is the whole history rendered with the
    chat template (the prefix cache may serve what earlier turns computed). Returns the result and
    the prompt token ids of every turn, which the peers then re-read in full."""
    before = engine.stats()
    messages: list[dict] = []
    records, prompts = [], []
    peak_usage = 0.0
    start = time.perf_counter()
    for turn, text in enumerate(user_messages):
        messages.append({"role": "user", "content": text})
        prompt = engine.render_chat(messages)
        prompts.append(prompt)
        record = RequestRecord(len(prompt), reply_len, start=time.perf_counter())
        engine.add_request(f"bench-turn-{turn}", prompt, _greedy(reply_len))
        reply: list[int] = []
        while engine.has_unfinished():
            outputs = engine.step()
            now = time.perf_counter()
            peak_usage = max(peak_usage, engine.stats().kv_cache_usage)
            for output in outputs:
                reply.extend(output.token_ids)
                record.token_times.extend([now] * output.num_output_tokens)
                advance(output.num_output_tokens)
        records.append(record)
        messages.append({"role": "assistant", "content": engine.detokenize(reply)})
    duration = time.perf_counter() - start
    result = RunResult(
        "localchat",
        engine_label(engine),
        records,
        duration,
        _engine_figures(engine, before, peak_usage),
    )
    return result, prompts
