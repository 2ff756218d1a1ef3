"""MCP servers in the chat without a model: the servers file and its errors (`chat --mcp`),
servers started with the chat (stdio and streamable HTTP, from tests/tui/mcp_server.py; a failing
one reported and skipped) and closed with it, a server that dies mid-call, and tool calls in the
stored conversation. The replies that call tools come from a fake backend; the tools are real."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from localchat.cli import app as cli_app
from localchat.tui.app import ChatApp
from localchat.tui.conversation import Conversation, StoredMessage
from localchat.tui.mcp_config import McpServerSpec, parse_mcp_config
from localchat.tui.messages import Notice
from localchat.tui.screens import TextScreen
from localchat.tui.session import ChatSession
from localchat.tui.store import ConversationStore
from localchat.tui.tool_round import DECLINED, STOPPED

from .conftest import reply_done, send, wait_until
from .fakes import FakeBackend
from .mcp_helpers import (
    SERVER,
    ToolCallingBackend,
    ask,
    last_tool_result,
    mcp_tools,
    question,
    roles,
    tool_views,
    tools_ready,
)


# --- the servers file -----------------------------------------------------------------------------
def test_the_shapes_of_claude_desktop_and_oterm_are_read():
    specs = parse_mcp_config(
        {
            "globalShortcut": "",  # other keys of the file are left alone
            "mcpServers": {
                "files": {"command": "npx", "args": ["-y", "fs", "."], "env": {"K": "v"}},
                "git": {"command": "uvx", "cwd": "/tmp", "icon": "🌳", "type": "stdio"},
                "remote": {"url": "https://example.com/mcp", "headers": {"X-Key": "k"}},
                "typed": {"type": "streamable-http", "url": "http://127.0.0.1:9/mcp"},
                "off": {"command": "never", "disabled": True},
            },
        },
        "servers.json",
    )
    assert specs == [
        McpServerSpec("files", command="npx", args=["-y", "fs", "."], env={"K": "v"}),
        McpServerSpec("git", command="uvx", cwd="/tmp"),
        McpServerSpec("remote", url="https://example.com/mcp", headers={"X-Key": "k"}),
        McpServerSpec("typed", url="http://127.0.0.1:9/mcp"),
    ]
    assert [s.transport for s in specs] == ["stdio", "stdio", "http", "http"]


BAD_FILES = [
    pytest.param(None, "there is no file", id="missing"),
    pytest.param('{"mcpServers": {', "is not JSON (Expecting", id="not-json"),
    pytest.param("[]", 'must be a JSON object with "mcpServers"', id="a-list"),
    pytest.param('{"servers": {}}', 'must be a JSON object with "mcpServers"', id="no-servers"),
    pytest.param('{"mcpServers": {"x": 1}}', "server 'x': must be an object", id="not-object"),
    pytest.param('{"mcpServers": {"x": {}}}', "server 'x': needs either `command`", id="empty"),
    pytest.param(
        '{"mcpServers": {"x": {"command": "a", "url": "http://b"}}}', "needs either", id="both"
    ),
    pytest.param(
        '{"mcpServers": {"x": {"command": "a", "args": "-v"}}}',
        "`args` must be a list of strings",
        id="args",
    ),
    pytest.param(
        '{"mcpServers": {"x": {"command": "a", "env": {"N": 1}}}}',
        "`env` must be an object of strings",
        id="env",
    ),
    pytest.param('{"mcpServers": {"x": {"url": "ftp://h"}}}', "http:// or https:// URL", id="url"),
    pytest.param(
        '{"mcpServers": {"x": {"command": "a", "type": "http"}}}',
        "type 'http' does not go with `command`",
        id="type",
    ),
    pytest.param(
        '{"mcpServers": {"x": {"url": "http://h/sse", "type": "sse"}}}',
        "SSE servers are not supported",
        id="sse",
    ),
]


@pytest.mark.parametrize("text, message", BAD_FILES)
def test_a_bad_servers_file_is_a_one_line_cli_error(tmp_path, text, message):
    path = tmp_path / "servers.json"
    if text is not None:
        path.write_text(text)
    result = CliRunner().invoke(cli_app, ["chat", "--mcp", str(path), "--no-history"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --mcp: ") and message in result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


def test_mcp_without_a_terminal_and_a_bad_timeout_are_refused(tmp_path):
    path = tmp_path / "servers.json"
    path.write_text('{"mcpServers": {}}')
    for args, message in [
        ([], "error: --mcp needs the terminal chat"),
        (["--mcp-timeout", "0"], "error: --mcp-timeout must be a positive number"),
    ]:
        result = CliRunner().invoke(cli_app, ["chat", "--mcp", str(path), *args], input="hi\n")
        assert result.exit_code == 2 and result.output.startswith(message), result.output


# --- the conversation with tool calls -------------------------------------------------------------
def _call(call_id: str, name: str = "add", arguments: str = '{"a": 1}') -> dict:
    return {"id": call_id, "name": name, "arguments": arguments}


def test_calls_go_to_the_model_with_their_results_and_regenerate_drops_them():
    conversation = Conversation(
        messages=[
            StoredMessage("user", "hi"),
            StoredMessage("assistant", "", meta={"tool_calls": [_call("c1"), _call("c2")]}),
            StoredMessage("tool", "2", meta={"tool_call_id": "c1", "name": "add"}),
            StoredMessage("assistant", "It is 2."),
        ]
    )
    wire = conversation.template_messages()
    # c2 never got a result (the user stopped first): an API would refuse it, so it stays out
    assert wire[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        ],
    }
    assert wire[2] == {"role": "tool", "content": "2", "tool_call_id": "c1"}
    assert "## Tool result: add (None)" in conversation.to_markdown()

    session = ChatSession(FakeBackend(), ConversationStore(None), conversation)
    assert session.drop_last_reply()  # the reply and the calls that led to it
    assert [m.role for m in conversation.messages] == ["user"]


# --- servers with the chat ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server():
    """tests/tui/mcp_server.py over streamable HTTP: its URL."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{line.split()[1]}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)


DYING = {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no config found')"]}


async def test_servers_start_with_the_chat_and_a_failing_one_is_reported(http_server):
    tools = mcp_tools(
        remote={"url": http_server},
        missing={"command": "localchat-no-such-command"},
        dying=DYING,
    )
    backend = ToolCallingBackend({"remote_add": {"a": 20, "b": 22}}, replies=["It is 42."])
    app = ChatApp(backend, ConversationStore(None), tools=tools)
    async with app.run_test(size=(110, 36)) as pilot:
        await tools_ready(pilot)
        errors = [str(n.render()) for n in app.chat.query(Notice) if n.has_class("error")]
        assert len(errors) == 2
        assert errors[0].startswith("MCP server missing did not start: FileNotFoundError")
        assert errors[1].startswith("MCP server dying did not start: ")
        assert errors[1].endswith("(stderr: no config found)")
        names = [t["function"]["name"] for t in app.chat.session.tools or []]
        assert names == ["add", "fail", "sleep", "crash"] + [
            f"remote_{n}" for n in ("add", "fail", "sleep", "crash")
        ]
        await send(pilot, "/mcp")
        assert isinstance(app.screen, TextScreen)
        assert f"remote  (http: {http_server})\n  ready" in app.screen.text
        assert "  • remote_add (the server's add)" in app.screen.text
        assert "missing  (stdio: localchat-no-such-command)\n  failed: " in app.screen.text
        await pilot.press("escape")

        await ask(pilot, "20 + 22?", "remote_add")
        screen = await question(pilot)
        assert (screen.name_, screen.server) == ("remote_add", "remote")
        await pilot.press("y")
        await reply_done(pilot)
        assert roles(app) == ["user", "assistant", "tool", "assistant"]
        result = app.chat.session.conversation.messages[2]
        assert (result.content, result.meta["server"], result.meta["status"]) == (
            "42",
            "remote",
            "done",
        )
        assert backend.requests[-1].messages[-1]["content"] == "42"
        assert app.chat.session.conversation.messages[-1].content == "It is 42."
    assert [c.status for c in tools.connections] == ["closed", "closed", "failed", "failed"]


async def test_a_server_that_dies_mid_call_is_an_error_and_the_chat_goes_on():
    tools = mcp_tools()
    app = ChatApp(
        ToolCallingBackend({"add": {"a": 1, "b": 2}}), ConversationStore(None), tools=tools
    )
    async with app.run_test(size=(110, 36)) as pilot:
        for tool, text in [
            ("crash", "the MCP server 'calc' closed the connection"),
            ("add", "the MCP server 'calc' is not running"),
        ]:
            await ask(pilot, "go", tool)
            await question(pilot)
            await pilot.press("y")
            await reply_done(pilot)
            result = app.chat.session.conversation.messages[-2]
            assert (result.role, result.meta["status"]) == ("tool", "error")
            assert result.content.startswith(text), result.content
            assert tool_views(app)[-1].state == "error"
        assert app.is_running and app.chat.session.conversation.messages[-1].role == "assistant"
        await send(pilot, "/tools")
        assert "calc  (stdio: " in app.screen.text
        assert "  failed: closed the connection" in app.screen.text


async def test_each_answer_to_the_question_on_a_fake_model():
    """yes, no, always, Esc at the question and Esc while the call runs; a tool error and a
    timeout (the fast twin of test_mcp_engine.py, which runs them on the real model)."""
    tools = mcp_tools(timeout=1.0)
    backend = ToolCallingBackend({"add": {"a": 2, "b": 3}})
    app = ChatApp(backend, ConversationStore(None), tools=tools)
    async with app.run_test(size=(110, 36)) as pilot:
        outcomes = []
        for tool, key in [
            ("add", "y"),
            ("add", "n"),
            ("add", "escape"),
            ("fail", "y"),
            ("sleep", "y"),
            ("add", "a"),
            ("add", None),  # always: no question
        ]:
            await ask(pilot, "go", tool)
            if key is not None:
                await question(pilot)
                await pilot.press(key)
            await reply_done(pilot)
            result = last_tool_result(app)
            outcomes.append((result.meta["status"], result.content))
            assert tool_views(app)[-1].state == result.meta["status"]
        assert outcomes == [
            ("done", "5"),
            ("declined", DECLINED),
            ("stopped", STOPPED),
            ("error", "Error executing tool fail: the disk is on fire"),
            ("timeout", "the tool 'sleep' gave no answer within 1 s"),
            ("done", "5"),
            ("done", "5"),
        ]
        # every result but the stopped one went back to the model, which answered it
        answers = [r.messages[-1] for r in backend.requests if r.tool_choice is None]
        assert [(a["role"], a["content"]) for a in answers] == [
            ("tool", content) for status, content in outcomes if status != "stopped"
        ]
        assert tools.always == {"add"}

        tools.timeout = 600.0
        await ask(pilot, "go", "sleep")
        await question(pilot)
        await pilot.press("y")
        view = tool_views(app)[-1]
        await wait_until(pilot, lambda: view.state == "running", what="the call to run")
        await pilot.press("escape")
        await reply_done(pilot)
        assert view.state == "stopped" and roles(app)[-1] == "tool"


async def test_without_mcp_tools_says_how_to_get_them():
    app = ChatApp(FakeBackend(), ConversationStore(None))
    async with app.run_test(size=(110, 36)) as pilot:
        await send(pilot, "/tools")
        assert not isinstance(app.screen, TextScreen)
        await send(pilot, "Hi")
        await reply_done(pilot)
        assert app.chat.session.tools is None and app.backend.requests[-1].tools is None
