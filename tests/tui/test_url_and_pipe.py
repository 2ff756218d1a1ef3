"""`localchat chat --url` against a real `localchat serve` process, and the pipe mode as a
subprocess."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.http_backend import OpenAIBackend
from localchat.tui.messages import AssistantMessage
from localchat.tui.screens import TextScreen
from localchat.tui.store import ConversationStore
from tests.serve_process import serve_process

from .conftest import greedy_conversation, reply_done, send, wait_until

pytestmark = pytest.mark.slow
API_KEY = "tui-test-key"


@pytest.fixture(scope="module")
def server_url(default_gguf, tmp_path_factory):
    """A `localchat serve` process on a free port, requiring an API key."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_process(
        log_path,
        "--max-model-len",
        "1024",
        "--kv-cache-memory",
        "128MiB",
        "--api-key",
        API_KEY,
        "--grace-period",
        "2",
        timeout=180,
    ) as server:
        yield server.base_url


@pytest.mark.asyncio(loop_scope="session")
async def test_url_mode_chats_with_a_real_server(server_url):
    backend = OpenAIBackend(server_url, api_key=API_KEY)
    app = ChatApp(backend, ConversationStore(None), conversation=greedy_conversation())
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)
        assert backend.model_name == "SmolLM2-135M-Instruct" and backend.max_model_len == 1024
        await send(pilot, "Hello there!")
        await reply_done(pilot)
        first = app.chat.session.conversation.messages[-1]
        assert first.role == "assistant" and first.content.strip() and not first.stopped
        assert first.meta["prompt_tokens"] > 0 and first.meta["completion_tokens"] > 0
        await send(pilot, "Tell me more.")
        await reply_done(pilot)
        second = app.chat.session.conversation.messages[-1]
        assert backend.last_body["messages"][1] == {"role": "assistant", "content": first.content}
        assert second.meta["cached_tokens"] > 0  # the server's prefix cache, reported in usage
        await send(pilot, "/prompt")
        assert isinstance(app.screen, TextScreen)
        # rendered by the server
        assert "<|im_start|>user\nHello there!<|im_end|>" in app.screen.text
        await pilot.press("escape")

        # long enough that Esc lands while it is still being written, however fast the engine
        await send(pilot, "/set max_tokens 800")
        await send(pilot, "Write a long poem about the sea.")
        await wait_until(
            pilot,
            lambda: (
                app.chat.session.conversation.messages[-1].role == "assistant"
                and app.chat.session.conversation.messages[-1].content
            ),
            what="the first words",
        )
        await pilot.press("escape")
        await reply_done(pilot)
        stopped = app.chat.session.conversation.messages[-1]
        assert stopped.stopped and stopped.content
        assert app.query(AssistantMessage).last().has_class("stopped")


def test_url_mode_without_a_key_reports_the_error(server_url):
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "chat", "--url", server_url, "--no-history"],
        input="hi",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "LOCALCHAT_API_KEY": ""},
    )
    assert result.returncode == 2 and "401" in result.stderr and "Traceback" not in result.stderr


def test_pipe_mode_with_url(server_url):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "localchat",
            "chat",
            "--url",
            server_url,
            "--api-key",
            API_KEY,
            "--no-history",
            "-t",
            "0",
            "-n",
            "8",
        ],
        input="Say hello.",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_pipe_mode_in_process_stores_the_turn(data_dir):
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "chat", "-t", "0", "-n", "8"],
        input="What is 2+2?",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "LOCALCHAT_DATA_DIR": str(data_dir)},
    )
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()
    assert answer and "\x1b[" not in result.stdout  # plain text, no TUI
    rows = (
        sqlite3.connect(data_dir / "conversations.sqlite3")
        .execute("SELECT role, content FROM messages ORDER BY position")
        .fetchall()
    )
    assert (
        rows[0] == ("user", "What is 2+2?")
        and rows[1][0] == "assistant"
        and rows[1][1].strip() == answer
    )
