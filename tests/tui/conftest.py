"""TUI fixtures: a private data directory for every test, one AsyncEngine on the default model
shared by the end-to-end tests, and helpers to build the app and wait on it."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

from localchat.tui.conversation import DEFAULT_SETTINGS, Conversation

GREEDY = {**DEFAULT_SETTINGS, "temperature": 0.0, "max_tokens": 8}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """Conversations of each test go to its own directory, never the user's."""
    path = tmp_path / "data"
    monkeypatch.setenv("LOCALCHAT_DATA_DIR", str(path))
    return path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chat_engine(default_gguf):
    """One started AsyncEngine for every end-to-end TUI test (the model loads once)."""
    from localchat.config import EngineConfig
    from localchat.engine.core.async_engine import AsyncEngine

    engine = AsyncEngine(EngineConfig(max_model_len=2048, kv_cache_memory="128MiB"))
    await engine.start()
    yield engine
    await engine.shutdown()


def greedy_conversation(**settings) -> Conversation:
    return Conversation(settings={**GREEDY, **settings})


async def wait_until(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    """Let the app run until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


async def send(pilot, text: str) -> None:
    """Type `text` into the prompt box and press Enter."""
    from localchat.tui.widgets import PromptBox

    prompt = pilot.app.query_one(PromptBox)
    prompt.load_text(text)
    prompt.move_cursor(prompt.document.end)
    await pilot.press("enter")
    await pilot.pause()


async def reply_done(pilot, timeout: float = 120.0) -> None:
    """Wait until the model is loaded and no reply is being written."""
    app = pilot.app
    await wait_until(
        pilot,
        lambda: app.chat.ready.is_set() and not app.chat.generating,
        timeout,
        "the reply to finish",
    )
    await asyncio.sleep(0)
