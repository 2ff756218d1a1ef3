"""`localchat chat [MODEL]`: the chat TUI (or plain streamed text when not on a terminal)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from localchat import envs
from localchat.cli_options import engine_options, stdin_is_tty
from localchat.errors import EmptyPromptError, InvalidParameterError
from localchat.tui.mcp_tools import DEFAULT_TIMEOUT_S, McpTools

if TYPE_CHECKING:
    from localchat.tui.backends import ChatBackend


@engine_options
def chat(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Model directory, .gguf file or hub id (default: the embedded "
            "SmolLM2-135M-Instruct); with --url, the model to ask the server for"
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Chat with an OpenAI-compatible server (e.g. http://localhost:8000) "
            "instead of the in-process engine",
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar=envs.API_KEY.name, help="API key for --url")
    ] = None,
    served_model: Annotated[
        str | None,
        typer.Option(
            "--model", help="With --url: the model name to ask for (default: the server's first)"
        ),
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Reopen the last conversation")] = False,
    no_history: Annotated[
        bool, typer.Option("--no-history", help="Keep nothing: conversations live in memory only")
    ] = False,
    system: Annotated[
        str | None, typer.Option("--system", help="System prompt of new conversations")
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature", "-t", help="Sampling temperature of new conversations (0 = greedy)"
        ),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", "-n", help="Longest reply of new conversations")
    ] = None,
    think: Annotated[
        bool | None,
        typer.Option("--think/--no-think", help="Thinking models: pass enable_thinking"),
    ] = None,
    mcp: Annotated[
        str | None,
        typer.Option(
            "--mcp",
            help="Offer the model the tools of the MCP servers in this JSON file (Claude "
            'Desktop\'s shape: {"mcpServers": {"name": {"command": ..., "args": [...]} or '
            '{"url": ...}}}); each call runs once you approve it',
        ),
    ] = None,
    mcp_timeout: Annotated[
        float,
        typer.Option("--mcp-timeout", help="Seconds a tool call may take before it is stopped"),
    ] = DEFAULT_TIMEOUT_S,
    engine_config=None,
) -> None:
    """Chat with a model in a full-screen terminal app; with stdin or stdout not a terminal, answer
    stdin."""
    from localchat.engine.sampling.sampling_params import SamplingParams
    from localchat.tui.conversation import DEFAULT_SETTINGS, Conversation
    from localchat.tui.store import ConversationStore, default_db_path

    settings = dict(DEFAULT_SETTINGS)
    if temperature is not None:
        settings["temperature"] = temperature
    if max_tokens is not None:
        settings["max_tokens"] = max_tokens
    SamplingParams(**settings)  # a bad flag is reported before anything loads
    tools = _mcp_tools(mcp, mcp_timeout)
    conversation = Conversation(system_prompt=system, settings=settings, think=think)
    backend: ChatBackend
    if url:
        from localchat.tui.http_backend import OpenAIBackend

        backend = OpenAIBackend(url, api_key, served_model or model)
    else:
        from localchat.tui.engine_backend import EngineBackend

        backend = EngineBackend(engine_config)
    store = ConversationStore(None if no_history else default_db_path())
    try:
        if not stdin_is_tty():
            from localchat.tui.pipe import run_pipe

            text = sys.stdin.read()
            if not text.strip():
                raise EmptyPromptError("nothing to send: stdin was empty")
            asyncio.run(
                run_pipe(backend, store, text.strip(), conversation=conversation, resume=resume)
            )
            return
        from localchat.tui.app import ChatApp

        ChatApp(backend, store, conversation=conversation, resume=resume, tools=tools).run()
    finally:
        store.close()


def _mcp_tools(path: str | None, timeout: float) -> McpTools | None:
    """The MCP servers of --mcp (none started yet); a bad file or flag fails here, in one line."""
    if path is None:
        return None
    from localchat.tui.mcp_config import load_mcp_config

    if not timeout > 0:
        raise InvalidParameterError("--mcp-timeout must be a positive number of seconds")
    specs = load_mcp_config(path)  # before anything loads
    if not stdin_is_tty():
        raise InvalidParameterError(
            "--mcp needs the terminal chat: each tool call waits for your approval"
        )
    return McpTools(specs, timeout=timeout)
