"""`/json` in the chat, through Pilot: on the real in-process engine and on a real `localchat serve`
(`--url`). The grammar makes even the tiny default model's replies valid JSON (checked with
json.loads and, for a schema file, jsonschema); a bad file or schema is a message in the chat and
changes nothing. With `--url`, a server's reasoning shows as thinking and its tool calls in a block
of their own (and in pipe mode, after the answer)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from localchat.config import EngineConfig
from localchat.engine.core.async_engine import AsyncEngine
from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.http_backend import OpenAIBackend
from localchat.tui.messages import AssistantMessage, Notice
from localchat.tui.pipe import run_pipe
from localchat.tui.screens import TextScreen
from localchat.tui.status_bar import StatusBar
from localchat.tui.store import ConversationStore
from tests.serve_process import serve_process

from .conftest import greedy_conversation, reply_done, send
from .fakes import FakeBackend

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
ASK = "Give me a person as JSON."
THINK_TEMPLATE = Path(__file__).parent.parent / "data" / "templates" / "think_open.jinja"


@pytest.fixture
def schema_files(tmp_path) -> dict[str, Path]:
    files = {
        "person": json.dumps(PERSON),
        "not_json": '{"type": "object",',
        "a_list": "[1, 2]",
        "bad_schema": json.dumps({"type": "object", "properties": {"a": {"type": "strnig"}}}),
    }
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    return {name: tmp_path / f"{name}.json" for name in files}


def _last_reply(app) -> str:
    message = app.chat.session.conversation.messages[-1]
    assert message.role == "assistant" and not message.meta.get("error"), message
    return message.content


def _status(app) -> str:
    return str(app.chat.query_one(StatusBar).render())


def _notices(app) -> list[tuple[str, bool]]:
    return [(str(n.render()), n.has_class("error")) for n in app.chat.query(Notice)]


def _json_app(backend) -> ChatApp:
    return ChatApp(
        backend, ConversationStore(None), conversation=greedy_conversation(max_tokens=150)
    )


async def _ask(pilot, app, text: str = ASK):
    """Send `text`; the reply, parsed as JSON."""
    await send(pilot, text)
    await reply_done(pilot)
    return json.loads(_last_reply(app))


class GrammarSpy(EngineBackend):
    """The engine backend, keeping the grammar of every request it sends."""

    def __init__(self, engine):
        super().__init__(engine=engine)
        self.grammars: list[str | None] = []

    def _grammar(self, request, prompt_tail):
        grammar = super()._grammar(request, prompt_tail)
        self.grammars.append(grammar)
        return grammar


async def _bad_files_change_nothing(pilot, app, files: dict[str, Path]) -> None:
    before = app.chat.session.json_mode
    for name, message in [
        ("missing", "there is no file"),
        ("not_json", "is not JSON (Expecting"),
        ("a_list", "holds a JSON list, not a schema object"),
        ("bad_schema", "is not a JSON schema replies can follow: Invalid type: strnig"),
    ]:
        path = files.get(name, files["person"].with_name("missing.json"))
        await send(pilot, f"/json {path}")
        text, error = _notices(app)[-1]
        assert error and message in text and "Traceback" not in text, text
        assert app.chat.session.json_mode is before
    assert app.is_running


async def test_json_on_the_in_process_engine(chat_engine, schema_files):
    backend = GrammarSpy(chat_engine)
    app = _json_app(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        await send(pilot, "/json")
        assert "{} JSON" in _status(app)
        assert isinstance(await _ask(pilot, app), dict)
        assert backend.grammars[-1] is not None

        await send(pilot, f"/json {schema_files['person']}")
        assert "{} JSON person.json" in _status(app)
        await send(pilot, "/show")
        assert isinstance(app.screen, TextScreen) and "json:           JSON person.json" in (
            app.screen.text
        )
        await pilot.press("escape")
        await _bad_files_change_nothing(pilot, app, schema_files)
        for _ in range(2):  # the mode stays on for the following replies
            jsonschema.validate(await _ask(pilot, app), PERSON)

        await send(pilot, "/json off")
        assert "JSON" not in _status(app)
        await send(pilot, "Say hi.")
        await reply_done(pilot)
        assert backend.grammars[-1] is None
        assert [text for text, error in _notices(app) if not error] == [
            "JSON on: the next replies are JSON objects (/json off ends it).",
            f"JSON on: the next replies follow the schema in {schema_files['person']} "
            "(/json off ends it).",
            "JSON off: replies are free text again.",
        ]


@contextlib.asynccontextmanager
async def _resumed(path: Path, backend: FakeBackend, ask: str = "again"):
    """The app started again on the store at `path` (resuming its last conversation) and its pilot,
    once `ask` is answered."""
    app = ChatApp(backend, ConversationStore(path), resume=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await reply_done(pilot)
        await send(pilot, ask)
        await reply_done(pilot)
        yield app, pilot


async def test_json_mode_comes_back_with_the_resumed_conversation(data_dir, schema_files):
    """/json is kept with the conversation: after a restart, resuming it (--resume or the chat
    list) turns the mode on again, with a notice, and the next request carries it, the schema
    itself saved (its file may have moved). /json off and a new chat end it."""
    path, schema_file = data_dir / "c.sqlite3", schema_files["person"]
    app = ChatApp(FakeBackend(), ConversationStore(path))
    async with app.run_test(size=(120, 30)) as pilot:
        await send(pilot, "/json")
        await send(pilot, "any object")
        await reply_done(pilot)
        plain_id, plain = app.chat.session.conversation.id, app.chat.session.json_mode
        await send(pilot, "/new")
        assert app.chat.session.json_mode is None and "JSON" not in _status(app)
        await send(pilot, f"/json {schema_file}")
        await send(pilot, "a person")
        await reply_done(pilot)
        schema_mode = app.chat.session.json_mode
        await pilot.press("ctrl+q")
    assert plain is not None and plain.label == "JSON" and plain.path is None
    assert schema_mode is not None and schema_mode.path == str(schema_file)
    schema_file.rename(schema_file.with_name("moved.json"))

    backend = FakeBackend()
    async with _resumed(path, backend) as (app, pilot):
        assert app.chat.session.json_mode == schema_mode and "{} JSON person.json" in _status(app)
        sent = backend.requests[-1].json_mode
        assert sent == schema_mode and sent.response_format["json_schema"]["schema"] == PERSON
        assert _notices(app) == [
            (
                f"JSON on: the next replies follow the schema in {schema_file} "
                "(/json off ends it).",
                False,
            )
        ]
        await pilot.press("ctrl+b", "down", "enter")  # the list is newest first
        await pilot.pause()
        assert app.chat.session.conversation.id == plain_id
        assert app.chat.session.json_mode == plain and "{} JSON" in _status(app)
        assert _notices(app) == [
            ("JSON on: the next replies are JSON objects (/json off ends it).", False)
        ]
        await send(pilot, "more")
        await reply_done(pilot)
        assert backend.requests[-1].json_mode == plain
        await send(pilot, "/json off")

    backend = FakeBackend()
    async with _resumed(path, backend) as (app, pilot):
        assert app.chat.session.conversation.id == plain_id
        assert app.chat.session.json_mode is None and backend.requests[-1].json_mode is None
        assert _notices(app) == [] and "JSON" not in _status(app)


def _serve(tmp_path_factory, *args: str):
    """A `localchat serve` process on the default model (its base URL, until the module ends)."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    args += ("--max-model-len", "1024", "--kv-cache-memory", "128MiB", "--threads", "1")
    with serve_process(log_path, *args, timeout=180) as server:
        yield server.base_url


async def test_json_leaves_the_thinking_free_in_process(default_gguf):
    """With a template that opens <think>, the in-process grammar applies after the thinking (as
    serve's does): the tiny model's reply, all thinking within 8 tokens, is free text, not JSON."""
    config = EngineConfig(
        chat_template=str(THINK_TEMPLATE), max_model_len=512, kv_cache_memory="32MiB"
    )
    engine = AsyncEngine(config)
    backend = GrammarSpy(engine)
    app = ChatApp(backend, ConversationStore(None), conversation=greedy_conversation())
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            await send(pilot, "/json")
            await send(pilot, "What is 2 + 2?")
            await reply_done(pilot)
    finally:
        await engine.shutdown()
    message = app.chat.session.conversation.messages[-1]
    assert backend.reasoning == "qwen3"
    grammar = json.loads(backend.grammars[-1] or "{}")
    assert grammar["grammars"][0]["name"] == "localchat_reasoning"
    assert message.thinking and not message.thinking.lstrip().startswith("{"), message
    assert message.content == ""


@pytest.fixture(scope="module")
def plain_server(default_gguf, tmp_path_factory):
    yield from _serve(tmp_path_factory)


async def test_json_with_url(plain_server, schema_files):
    backend = OpenAIBackend(plain_server)
    app = _json_app(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        await reply_done(pilot)
        await send(pilot, f"/json {schema_files['person']}")
        assert "{} JSON person.json" in _status(app)
        jsonschema.validate(await _ask(pilot, app), PERSON)
        assert backend.last_body is not None
        sent = backend.last_body["response_format"]
        assert sent == {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        await _bad_files_change_nothing(pilot, app, schema_files)

        await send(pilot, "/json")
        assert isinstance(await _ask(pilot, app), dict)
        assert backend.last_body["response_format"] == {"type": "json_object"}

        await send(pilot, "/json off")
        await send(pilot, "Say hi.")
        await reply_done(pilot)
        assert "response_format" not in backend.last_body and "JSON" not in _status(app)


@pytest.fixture(scope="module")
def thinking_server(default_gguf, tmp_path_factory):
    """A server whose template opens <think> for every reply: its reasoning parser (picked from the
    template) sends the whole reply of the tiny model as reasoning_content."""
    yield from _serve(tmp_path_factory, "--chat-template", str(THINK_TEMPLATE))


@contextlib.asynccontextmanager
async def _one_reply(backend, text: str):
    """The app (still running) and the stored reply, once `text` is answered."""
    app = ChatApp(backend, ConversationStore(None), conversation=greedy_conversation())
    async with app.run_test(size=(120, 30)) as pilot:
        await reply_done(pilot)
        await send(pilot, text)
        await reply_done(pilot)
        yield app, app.chat.session.conversation.messages[-1]


async def test_a_servers_reasoning_shows_as_thinking(thinking_server):
    backend = OpenAIBackend(thinking_server)
    async with _one_reply(backend, "What is 2 + 2?") as (app, message):
        direct = httpx.post(
            f"{thinking_server}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                **{k: backend.last_body[k] for k in ("temperature", "top_p", "max_tokens")},
            },
            timeout=60,
        ).json()["choices"][0]["message"]
        assert direct["reasoning_content"] and not direct["content"]
        assert (message.thinking, message.content) == (direct["reasoning_content"], "")
        view = app.chat.query(AssistantMessage).last()
        assert view.thinking_block.display and view.thinking == message.thinking
        assert "<think>" not in view.markdown.source


def _sse(*chunks) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def _tool_call_server(request: httpx.Request) -> httpx.Response:
    """A scripted OpenAI-style server (no server sends tool calls to a chat that offers no tools):
    its reply's call arrives as an id and name, then argument fragments."""
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 512}]})
    if request.url.path == "/tokenize":
        return httpx.Response(404)
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}

    def piece(arguments: str) -> dict:
        return {"index": 0, "function": {"arguments": arguments}}

    body = _sse(
        {"choices": [{"delta": {"reasoning_content": "The user wants weather."}}]},
        {"choices": [{"delta": {"tool_calls": [call]}}]},
        {"choices": [{"delta": {"tool_calls": [piece("{")]}}]},
        {"choices": [{"delta": {"tool_calls": [piece('"c":1}')]}, "finish_reason": "tool_calls"}]},
    )
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


CALLS = [{"id": "call_1", "name": "weather", "arguments": '{"c":1}'}]


async def test_a_servers_tool_calls_show_in_a_block_of_their_own():
    backend = OpenAIBackend("http://x", transport=httpx.MockTransport(_tool_call_server))
    async with _one_reply(backend, "Weather?") as (app, message):
        assert message.role == "assistant" and message.content == ""  # kept: it has a call
        assert message.tool_calls == CALLS and message.thinking == "The user wants weather."
        view = app.chat.query(AssistantMessage).last()
        assert view.calls.display and str(view.calls.render()) == '⚙ tool call  weather({"c":1})'
        assert "tool call" not in view.markdown.source
        assert '**Tool call:** `weather({"c":1})`' in app.chat.session.conversation.to_markdown()


async def test_pipe_mode_prints_a_servers_tool_calls():
    store = ConversationStore(None)
    out, err = io.StringIO(), io.StringIO()
    backend = OpenAIBackend("http://x", transport=httpx.MockTransport(_tool_call_server))
    await run_pipe(backend, store, "Weather?", out=out, err=err)
    assert out.getvalue() == '\n⚙ tool call  weather({"c":1})\n'
    assert err.getvalue() == "The user wants weather."
    stored = store.load(store.last_id())
    assert stored is not None and stored.messages[-1].tool_calls == CALLS
