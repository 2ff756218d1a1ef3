"""The real `localchat chat` process on the default model: killed with SIGKILL mid-reply and
reopened with --resume (in a private tmux server, whose `capture-pane` gives the screen as text);
--no-history keeps no file; old turns are left out by the real tokenizer's count."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from localchat.tui.conversation import StoredMessage
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.session import ChatSession
from localchat.tui.store import ConversationStore

from .conftest import greedy_conversation

pytestmark = pytest.mark.slow
PROMPT = "Write a very long story about a dragon who collects teapots."


def _until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)
    return value


class Tmux:
    """One private tmux server (its own socket) running one command in a 100x50 window."""

    def __init__(self, env: dict):
        self.socket, self.env = f"localchat-test-{uuid.uuid4().hex[:8]}", env

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
            timeout=30,
        ).stdout

    def start(self, *chat_args: str) -> None:
        command = "exec " + shlex.join([sys.executable, "-m", "localchat", "chat", *chat_args])
        self.tmux("new-session", "-d", "-s", "chat", "-x", "100", "-y", "50", command)

    def pid(self) -> int:
        return int(self.tmux("list-panes", "-t", "chat", "-F", "#{pane_pid}").split()[0])

    def screen(self) -> str:
        try:
            return self.tmux("capture-pane", "-p", "-t", "chat")
        except subprocess.CalledProcessError:
            return ""

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-L", self.socket, "kill-server"],
            capture_output=True,
            env=self.env,
            timeout=30,
            check=False,
        )


def _rows(db_path) -> list[tuple[str, str]]:
    if not db_path.exists():
        return []
    with sqlite3.connect(db_path) as db:
        return db.execute("SELECT role, content FROM messages ORDER BY position").fetchall()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to run the chat in a terminal")
def test_killed_mid_reply_and_resumed_shows_the_message_and_the_partial_reply(
    data_dir, default_gguf
):
    env = {**os.environ, "LOCALCHAT_DATA_DIR": str(data_dir), "TERM": "xterm-256color"}
    db_path = data_dir / "conversations.sqlite3"
    tmux = Tmux(env)
    try:
        tmux.start("-t", "0", "-n", "1000", "--max-model-len", "2048")
        _until(lambda: "Chat with" in tmux.screen(), 120, "the chat to start")
        tmux.tmux("send-keys", "-t", "chat", "-l", PROMPT)
        tmux.tmux("send-keys", "-t", "chat", "Enter")
        # the reply is stored as it streams: kill the process once part of it is on disk and it is
        # still writing
        rows = _until(
            lambda: (r := _rows(db_path)) and len(r) == 2 and r[1][1].strip() and r,
            300,
            "a partial reply in the store",
        )
        assert "generating" in tmux.screen()
        os.kill(tmux.pid(), signal.SIGKILL)
        _until(lambda: not tmux.screen(), 30, "the killed chat's window to close")
        rows = _rows(db_path)
        assert rows[0] == ("user", PROMPT) and rows[1][0] == "assistant"
        partial = rows[1][1]
        assert partial.strip()

        tmux.start("--resume")
        first_words = " ".join(partial.split()[:3])
        screen = _until(
            lambda: (s := tmux.screen()) and PROMPT in s and first_words in s and s,
            120,
            f"the resumed chat to show the prompt and {first_words!r}",
        )
        assert "Chat with" not in screen  # the conversation, not the welcome text
        tmux.tmux("send-keys", "-t", "chat", "C-q")
        _until(lambda: not tmux.screen(), 30, "the chat to quit")
    finally:
        tmux.close()
    assert _rows(db_path)[:2] == [
        ("user", PROMPT),
        ("assistant", partial),
    ]  # resuming changed nothing


def test_no_history_writes_no_database(data_dir, default_gguf):
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "chat", "--no-history", "-t", "0", "-n", "4"],
        input="Hi!",
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LOCALCHAT_DATA_DIR": str(data_dir)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert not data_dir.exists() or not any(data_dir.iterdir())


@pytest.mark.asyncio(loop_scope="session")
async def test_old_turns_are_left_out_by_the_real_tokenizer(chat_engine):
    """max_model_len 2048 with 1,500 tokens kept for the reply: the history must fit in 548
    tokens."""
    backend = EngineBackend(engine=chat_engine)
    await backend.start()
    session = ChatSession(backend, ConversationStore(None), greedy_conversation(max_tokens=1500))
    paragraph = (
        "The lighthouse keeper counted the waves and wrote each number in a small blue book. " * 8
    )
    for turn in range(4):
        session.add_user(f"Turn {turn}: {paragraph}")
        session.add_reply(StoredMessage("assistant", f"Reply {turn}: {paragraph}"))
    session.add_user("And now?")
    full = await backend.count_prompt_tokens(session.request(0))
    assert full + 1500 > 2048  # the whole history does not fit

    plan = await session.plan_turn()
    assert plan.dropped > 0 and session.context_start == plan.dropped
    assert plan.request.messages[0]["role"] == "user"  # cut at a turn's start
    assert plan.prompt_tokens == len(
        chat_engine.render_chat(plan.request.messages, add_generation_prompt=True)
    )
    assert plan.prompt_tokens + 1500 <= 2048
    earlier = max(i for i in session.conversation.user_indices() if i < session.context_start)
    # dropped only what it had to
    assert await backend.count_prompt_tokens(session.request(earlier)) + 1500 > 2048
    plan.request.sampling["max_tokens"] = 2
    deltas = [
        delta async for delta in backend.stream(plan.request)
    ]  # the engine takes the prompt as planned
    assert deltas[-1].prompt_tokens == plan.prompt_tokens
