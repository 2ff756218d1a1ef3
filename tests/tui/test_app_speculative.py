"""The chat on an engine with speculative decoding: the status bar shows how many drafted tokens
the model kept, and `/set speculative` turns it off, on, or to another method."""

from __future__ import annotations

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.store import ConversationStore

from .conftest import greedy_conversation, reply_done, send, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

COPY = "Repeat exactly: the quick brown fox jumps over the lazy dog near the quiet river bank."


async def test_the_status_bar_and_set_speculative(default_gguf):
    from localchat.config import EngineConfig
    from localchat.engine.core.async_engine import AsyncEngine

    config = EngineConfig(
        max_model_len=2048,
        kv_cache_memory="128MiB",
        speculative_config='{"method": "ngram", "num_speculative_tokens": 4}',
    )
    engine = AsyncEngine(config)
    await engine.start()
    try:
        app = ChatApp(
            EngineBackend(engine=engine),
            ConversationStore(None),
            conversation=greedy_conversation(max_tokens=40),
        )
        async with app.run_test(size=(120, 30)) as pilot:
            await send(pilot, COPY)
            await reply_done(pilot)
            stats = engine.stats()
            assert stats.spec_accepted_tokens_total > 0
            share = stats.spec_accepted_tokens_total / stats.spec_draft_tokens_total
            status = str(app.query_one("#status").render())
            assert f"spec {share:.0%} of {stats.spec_draft_tokens_total} drafted" in status

            await send(pilot, "/set speculative off")
            await send(pilot, COPY)
            await reply_done(pilot)
            assert engine.stats().spec_draft_tokens_total == stats.spec_draft_tokens_total

            await send(pilot, "/set speculative suffix")
            await send(pilot, COPY)
            await reply_done(pilot)
            assert engine.stats().spec_draft_tokens_total > stats.spec_draft_tokens_total

            notes: list[str] = []
            app.notify = lambda message, **kwargs: notes.append(str(message))  # type: ignore
            await send(pilot, "/set speculative guess")
            await wait_until(pilot, lambda: notes, what="an error note")
            assert "speculative must be ngram, suffix, off" in notes[-1]
            await send(pilot, '/set speculative {"method": "eagle"}')
            await wait_until(pilot, lambda: len(notes) > 1, what="a second error note")
            assert "speculative_config.method" in notes[-1]
            await send(pilot, '/set speculative {"method": "draft_model"}')
            await wait_until(pilot, lambda: len(notes) > 2, what="a third error note")
            assert "speculative_config.model" in notes[-1]
    finally:
        await engine.shutdown()
