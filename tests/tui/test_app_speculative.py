"""The chat on an engine with speculative decoding: the status bar shows how many drafted tokens
the model kept."""

from __future__ import annotations

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.store import ConversationStore

from .conftest import greedy_conversation, reply_done, send

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


async def test_the_status_bar_shows_the_acceptance(default_gguf):
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
            conversation=greedy_conversation(max_tokens=60),
        )
        async with app.run_test(size=(120, 30)) as pilot:
            await send(pilot, "Count from 1 to 40, separated by commas.")
            await reply_done(pilot)
            status = str(app.query_one("#status").render())
            stats = engine.stats()
            assert stats.spec_draft_tokens_total > 0
            share = stats.spec_accepted_tokens_total / stats.spec_draft_tokens_total
            assert f"spec {share:.0%} of {stats.spec_draft_tokens_total} drafted" in status
    finally:
        await engine.shutdown()
