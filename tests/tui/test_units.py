"""The TUI's pieces without a screen: thinking split, slash-command parsing, the store, the SSE
client."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from localchat.errors import InvalidParameterError
from localchat.tui.backends import ChatRequest
from localchat.tui.commands import (
    UnknownCommandError,
    parse_setting,
    parse_slash,
    parse_think,
)
from localchat.tui.conversation import DEFAULT_SETTINGS, Conversation, StoredMessage
from localchat.tui.http_backend import OpenAIBackend, ServerError
from localchat.tui.json_mode import parse_json_command
from localchat.tui.store import ConversationStore
from localchat.tui.thinking import ThinkSplitter


def split(pieces: list[str], in_thinking: bool = False) -> tuple[str, str]:
    splitter, thinking, answer = ThinkSplitter(in_thinking), "", ""
    for piece in pieces:
        t, a = splitter.feed(piece)
        thinking, answer = thinking + t, answer + a
    t, a = splitter.flush()
    return thinking + t, answer + a


@pytest.mark.parametrize(
    "pieces, expected",
    [
        (["Hello", " world"], ("", "Hello world")),
        (["<th", "ink>hmm", " ok</th", "ink>\n\nAnswer"], ("hmm ok", "Answer")),
        (["\n<think>", "a</think>", "b"], ("a", "b")),
        (["<", "b>bold</b>"], ("", "<b>bold</b>")),
        (["<think>never closed"], ("never closed", "")),
    ],
)
def test_think_splitter(pieces, expected):
    assert split(pieces) == expected


def test_think_splitter_when_the_prompt_opened_the_block():
    assert split(["pondering", "</think>", " done"], in_thinking=True) == ("pondering", "done")


def test_slash_parsing():
    command, args = parse_slash("/set temperature 0.2")
    assert command.name == "set" and args == "temperature 0.2"
    assert parse_slash("hello") is None and parse_slash("//not a command") is None
    assert parse_slash("/regenerate")[0].name == "regen"
    with pytest.raises(UnknownCommandError):
        parse_slash("/frobnicate")


def test_setting_values_are_checked_like_sampling_params():
    settings = dict(DEFAULT_SETTINGS)
    assert parse_setting("temperature 0.2", settings) == ("temperature", 0.2)
    assert parse_setting("top-k 40", settings) == ("top_k", 40)
    assert parse_setting("seed none", settings) == ("seed", None)
    for bad in (
        "temperature -1",
        "top_p 0",
        "max_tokens 0",
        "top_k 1.5",
        "colour 3",
        "temperature",
    ):
        with pytest.raises(InvalidParameterError):
            parse_setting(bad, settings)
    assert (
        parse_think("on") is True and parse_think("off") is False and parse_think("default") is None
    )


def test_store_round_trip_truncate_and_delete(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    conversation = Conversation(title="t", system_prompt="sys", think=False)
    conversation.messages = [
        StoredMessage("user", "q"),
        StoredMessage("assistant", "a", "why", True, {"ttft": 0.5}),
    ]
    store.save_message(conversation, 0)
    store.save_message(conversation, 1)
    again = ConversationStore(tmp_path / "c.sqlite3")
    assert again.load(conversation.id) == conversation
    store.truncate(conversation, 1)
    assert [m.content for m in again.load(conversation.id).messages] == ["q"]
    assert again.last_id() == conversation.id and again.list_conversations() == [
        (conversation.id, "t")
    ]
    store.delete(conversation.id)
    assert again.load(conversation.id) is None


# The schema as released (a copy, not imported): databases written by it must keep loading.
_RELEASED_SCHEMA = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, system_prompt TEXT,
    settings TEXT NOT NULL, think INTEGER, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE messages (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '', stopped INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (conversation_id, position)
);
"""


def _released_database(path: Path) -> None:
    """A database as the released schema wrote it: conversation 7, 'old', with two messages."""
    db = sqlite3.connect(path)
    db.executescript(_RELEASED_SCHEMA)
    db.execute(
        "INSERT INTO conversations VALUES (7, 'old', 'be brief', ?, 1, 1.0, 2.0)",
        (json.dumps(DEFAULT_SETTINGS),),
    )
    db.execute(  # thinking, stopped and meta left to their defaults
        "INSERT INTO messages (conversation_id, position, role, content)"
        " VALUES (7, 0, 'user', 'hi')"
    )
    db.execute(
        "INSERT INTO messages VALUES (7, 1, 'assistant', 'hello', 'hmm', 1, ?)",
        (json.dumps({"ttft": 0.25}),),
    )
    db.commit()
    db.close()


def test_a_database_written_by_the_released_schema_loads_and_takes_new_messages(tmp_path):
    path = tmp_path / "old.sqlite3"
    _released_database(path)
    store = ConversationStore(path)
    conversation = store.load(7)
    assert conversation == Conversation(
        7,
        "old",
        [
            StoredMessage("user", "hi"),
            StoredMessage("assistant", "hello", "hmm", True, {"ttft": 0.25}),
        ],
        "be brief",
        DEFAULT_SETTINGS,
        True,
    )
    conversation.messages.append(StoredMessage("user", "again"))
    store.save_message(conversation, 2)
    assert [m.content for m in ConversationStore(path).load(7).messages] == ["hi", "hello", "again"]


def _columns(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[1] for row in db.execute("PRAGMA table_info(conversations)")]
    finally:
        db.close()


def test_a_released_database_gets_the_json_mode_column_and_keeps_its_conversations(tmp_path):
    """Opened by this version, a database from before /json was stored gains a json_mode column
    (NULL: off) and nothing else changes; its conversation then saves a /json mode, the schema
    with it, which loads again even after the schema file is gone."""
    path = tmp_path / "old.sqlite3"
    _released_database(path)
    assert "json_mode" not in _columns(path)
    store = ConversationStore(path)
    assert _columns(path)[-1] == "json_mode"
    conversation = store.load(7)
    assert conversation is not None and conversation.json_mode is None
    assert (conversation.title, conversation.system_prompt, conversation.think) == (
        "old",
        "be brief",
        True,
    )
    assert [m.content for m in conversation.messages] == ["hi", "hello"]

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    schema_file = tmp_path / "city.json"
    schema_file.write_text(json.dumps(schema))
    conversation.json_mode = parse_json_command(str(schema_file))
    store.save_conversation(conversation)
    store.close()
    schema_file.unlink()
    again = ConversationStore(path)  # the column is there already: opening again changes nothing
    assert _columns(path).count("json_mode") == 1
    loaded = again.load(7)
    assert loaded == conversation and loaded.json_mode is not None
    assert loaded.json_mode.label == "JSON city.json" and loaded.json_mode.path == str(schema_file)
    assert loaded.json_mode.response_format["json_schema"]["schema"] == schema

    loaded.json_mode = parse_json_command("")
    again.save_conversation(loaded)
    assert again.load(7).json_mode == parse_json_command("on")
    loaded.json_mode = None
    again.save_conversation(loaded)
    assert again.load(7) == loaded and [m.content for m in loaded.messages] == ["hi", "hello"]


def test_a_stored_json_mode_that_no_longer_makes_a_grammar_is_left_off(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = ConversationStore(path)
    conversation = Conversation(title="t", json_mode=parse_json_command(""))
    store.save_conversation(conversation)
    broken = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}
    with store.db:
        store.db.execute(
            "UPDATE conversations SET json_mode=? WHERE id=?",
            (json.dumps({"label": "JSON x.json", "response_format": broken}), conversation.id),
        )
    loaded = store.load(conversation.id)
    assert loaded is not None and loaded.title == "t" and loaded.json_mode is None


def _sse(*chunks) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


async def test_openai_backend_streams_thinking_text_and_usage():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 512}]})
        seen["body"] = json.loads(request.content)
        seen["auth"] = request.headers.get("authorization")
        body = _sse(
            {"choices": [{"delta": {"reasoning_content": "hmm"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "!"}, "finish_reason": "stop"}]},
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": 8},
                },
            },
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    backend = OpenAIBackend("http://x", api_key="k", transport=httpx.MockTransport(handler))
    await backend.start()
    assert (backend.model_name, backend.max_model_len) == ("m", 512)
    settings = {**DEFAULT_SETTINGS, "top_k": 5, "seed": 3}
    deltas = [
        d
        async for d in backend.stream(
            ChatRequest([{"role": "user", "content": "q"}], settings, {"enable_thinking": True})
        )
    ]
    assert "".join(d.thinking for d in deltas) == "hmm" and "".join(d.text for d in deltas) == "Hi!"
    assert (deltas[-1].prompt_tokens, deltas[-1].cached_tokens, deltas[-1].completion_tokens) == (
        10,
        8,
        3,
    )
    body = seen["body"]
    assert (
        body["stream"]
        and body["top_k"] == 5
        and body["seed"] == 3
        and "repetition_penalty" not in body
    )
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and seen["auth"] == "Bearer k"
    await backend.close()


async def test_openai_backend_reports_http_errors():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(400, json={"error": {"message": "max_tokens is too large"}})

    backend = OpenAIBackend("http://x", transport=httpx.MockTransport(handler))
    await backend.start()
    with pytest.raises(ServerError, match="answered 400: max_tokens is too large"):
        async for _ in backend.stream(
            ChatRequest([{"role": "user", "content": "q"}], dict(DEFAULT_SETTINGS))
        ):
            pass
    await backend.close()


def test_reply_stats_fold_deltas_without_losing_known_values():
    from localchat.tui.backends import ReplyDelta, ReplyStats

    stats = ReplyStats()
    stats.apply(ReplyDelta("a", completion_tokens=1, ttft=0.2))
    assert stats.context_tokens is None and stats.as_meta() == {"completion_tokens": 1, "ttft": 0.2}
    stats.apply(ReplyDelta("b", finish_reason="stop", completion_tokens=2, tokens_per_s=9.0))
    stats.apply(ReplyDelta(completion_tokens=2, prompt_tokens=10, cached_tokens=8))  # a usage chunk
    assert stats.as_meta() == {
        "prompt_tokens": 10,
        "cached_tokens": 8,
        "completion_tokens": 2,
        "ttft": 0.2,
        "tokens_per_s": 9.0,
        "finish_reason": "stop",
    }
    assert stats.context_tokens == 12
