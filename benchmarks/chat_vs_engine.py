"""The tok/s a user sees in `localchat chat` against what the engine makes alone (issue 9, item 4).

Both run in one process on one AsyncEngine (the default model unless MODEL is given), on the same
prompt and settings: the chat's default sampling (temperature 0.7, top_p 0.95), a fixed seed,
`--max-tokens` new tokens with ignore_eos. "Engine alone" consumes `AsyncEngine.generate` on the
event loop and does nothing else; "chat" is the real ChatApp on the in-process backend, driven
headless by Textual's Pilot (it composes, lays out and renders every frame; only the terminal write
is skipped). Runs alternate, engine first, to spread machine noise over both. Decode tok/s is
(tokens - 1) / (last token time - first token time) as the event loop sees the tokens, which is also
what the chat's status bar shows.

The event loop thread's CPU time per token is the UI's cost: on a 2-core machine every millisecond
of it is taken from the engine's threads (torch's intra-op pool and the GIL).

    python benchmarks/chat_vs_engine.py [--rounds 3] [--max-tokens 256] [--threads N] [MODEL]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


@dataclass
class Run:
    tokens: int
    tokens_per_s: float
    loop_cpu_ms_per_token: float  # CPU time of the event loop thread, per token
    process_cpu_share: (
        float  # process CPU seconds / wall seconds over the reply (2.0 = both cores busy)
    )


async def engine_alone(engine, settings: dict) -> Run:
    from localchat.engine.sampling.sampling_params import SamplingParams

    token_ids = engine.render_chat(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    times: list[float] = []
    tokens = 0
    cpu0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    async for output in engine.generate(token_ids, SamplingParams(**settings)):
        new = len(output.outputs[0].token_ids)
        if new:
            tokens += new
            times.append(time.perf_counter())
    cpu, proc, wall = (
        time.thread_time() - cpu0,
        time.process_time() - proc0,
        time.perf_counter() - wall0,
    )
    return Run(tokens, (tokens - 1) / (times[-1] - times[0]), 1000 * cpu / tokens, proc / wall)


async def chat(engine, settings: dict, size: tuple[int, int]) -> Run:
    from localchat.tui.app import ChatApp
    from localchat.tui.conversation import Conversation
    from localchat.tui.engine_backend import EngineBackend
    from localchat.tui.store import ConversationStore
    from localchat.tui.widgets import PromptBox

    app = ChatApp(
        EngineBackend(engine=engine),
        ConversationStore(None),
        conversation=Conversation(settings=settings),
    )
    async with app.run_test(size=size) as pilot:
        while not app.chat.ready.is_set():
            await pilot.pause(0.05)
        prompt = app.query_one(PromptBox)
        prompt.load_text(PROMPT)
        cpu0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        await pilot.press("enter")
        await pilot.pause()
        while app.chat.generating:
            await asyncio.sleep(0.05)
        cpu, proc, wall = (
            time.thread_time() - cpu0,
            time.process_time() - proc0,
            time.perf_counter() - wall0,
        )
        reply = app.chat.session.conversation.messages[-1]
    tokens = reply.meta["completion_tokens"]
    return Run(tokens, reply.meta["tokens_per_s"], 1000 * cpu / tokens, proc / wall)


def _summary(name: str, runs: list[Run]) -> str:
    speeds = ", ".join(f"{r.tokens_per_s:.1f}" for r in runs)
    speed = statistics.median(r.tokens_per_s for r in runs)
    loop_ms = statistics.median(r.loop_cpu_ms_per_token for r in runs)
    loop_percent = statistics.median(r.loop_cpu_ms_per_token * r.tokens_per_s / 10 for r in runs)
    process = statistics.median(r.process_cpu_share for r in runs)
    return (
        f"{name:<12} tok/s median {speed:6.2f} ({speeds})  "
        f"loop CPU {loop_ms:5.2f} ms/token ({loop_percent:.1f}% of a core)  "
        f"process CPU {process:.2f} cores"
    )


async def main(args: argparse.Namespace) -> None:
    import torch

    from localchat.config import EngineConfig
    from localchat.engine.core.async_engine import AsyncEngine
    from localchat.tui.conversation import DEFAULT_SETTINGS

    engine = AsyncEngine(
        EngineConfig(model=args.model, num_threads=args.threads, max_model_len=2048)
    )
    await engine.start()
    settings = {**DEFAULT_SETTINGS, "max_tokens": args.max_tokens, "ignore_eos": True, "seed": 0}
    try:
        print(
            f"model {engine.model_name}, torch threads {torch.get_num_threads()}, "
            f"{os.cpu_count()} CPUs, {args.max_tokens} tokens, "
            f"temperature {settings['temperature']}, top_p {settings['top_p']}",
            flush=True,
        )
        await engine_alone(engine, {**settings, "max_tokens": 32})  # warm up
        alone: list[Run] = []
        in_chat: list[Run] = []
        for index in range(args.rounds):
            alone.append(await engine_alone(engine, settings))
            in_chat.append(await chat(engine, settings, (args.width, args.height)))
            # each round's app leaves garbage behind: collect it here, not while a reply is timed
            gc.collect()
            print(
                f"round {index + 1}: engine {alone[-1].tokens_per_s:.2f} tok/s, "
                f"chat {in_chat[-1].tokens_per_s:.2f} tok/s; "
                f"event loop CPU {alone[-1].loop_cpu_ms_per_token:.2f} / "
                f"{in_chat[-1].loop_cpu_ms_per_token:.2f} ms per token",
                flush=True,
            )
    finally:
        await engine.shutdown()
    print(_summary("engine alone", alone))
    print(_summary("chat", in_chat))
    ratio = statistics.median(r.tokens_per_s for r in in_chat) / statistics.median(
        r.tokens_per_s for r in alone
    )
    print(f"chat / engine: {ratio:.3f}x (target >= 0.95)")
    # each chat round against the engine-alone round just before it: steadier when the machine's
    # speed drifts during the run
    paired = statistics.median(
        c.tokens_per_s / a.tokens_per_s for a, c in zip(alone, in_chat, strict=True)
    )
    print(f"chat / engine, median of the rounds' ratios: {paired:.3f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model", nargs="?", default=None, help="model (default: the embedded default model)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the engine's)"
    )
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--height", type=int, default=40)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
