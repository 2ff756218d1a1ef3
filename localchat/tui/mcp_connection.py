"""One MCP server seen from the chat, on the official `mcp` SDK: started (a child process over
stdio, or a streamable-HTTP URL), its tools listed, called with a timeout, and closed. Nothing it
does raises into the chat: a server that fails to start is `failed` with its error, a call that
fails or times out is a ToolOutcome saying so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from dataclasses import dataclass
from typing import Any

from localchat.tui.mcp_config import McpServerSpec

logger = logging.getLogger("localchat.tui")
# A tool result longer than this is cut (it goes into the prompt of the next reply).
MAX_RESULT_CHARS = 16_000


@dataclass(frozen=True)
class McpTool:
    """A tool as its server lists it: name, description and the JSON schema of its arguments."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ToolOutcome:
    """What a call came to: `status` is "done", "error" (the tool or its server failed) or
    "timeout"; `text` what the model is told (the tool's text, or the error)."""

    status: str
    text: str

    @property
    def failed(self) -> bool:
        return self.status != "done"


def describe_error(exc: BaseException) -> str:
    """An exception in one line; a task group's (the SDK's transports run in anyio task groups)
    reads as its first error."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        message = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def result_text(result: Any) -> str:
    """A CallToolResult as text for the model: its text blocks, a note for each other block, or its
    structured content when it has nothing else."""
    import json

    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}]")
        else:
            parts.append(f"[{kind}: {getattr(block, 'uri', '') or getattr(block, 'name', '')}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[… cut: {len(text)} characters in all]"
    return text


class McpConnection:
    """One server. `start()` connects and lists its tools (status "ready"), or records why it could
    not (status "failed"); `close()` ends it. The SDK's client must be entered and left in one
    task, so it lives in a task of its own, which `call()` talks to through the client."""

    def __init__(self, spec: McpServerSpec, *, start_timeout: float = 30.0):
        self.spec, self.start_timeout = spec, start_timeout
        self.status = "not started"  # starting, ready, failed, closed
        self.error: str | None = None
        self.tools: list[McpTool] = []
        self._client: Any = None
        self._task: asyncio.Task | None = None
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        # a stdio server's stderr: kept out of the terminal, and its last line said when it fails
        self._stderr = tempfile.TemporaryFile(  # noqa: SIM115 (closed by close())
            "w+", encoding="utf-8", errors="replace"
        )

    @property
    def name(self) -> str:
        return self.spec.name

    def _transport(self) -> Any:
        spec = self.spec
        if spec.command is not None:
            from mcp import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=spec.command, args=spec.args, env=spec.env or None, cwd=spec.cwd
            )
            return stdio_client(params, errlog=self._stderr)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert spec.url is not None
        http = httpx2.AsyncClient(headers=spec.headers, timeout=httpx2.Timeout(30.0, read=300.0))
        return streamable_http_client(spec.url, http_client=http)

    async def start(self) -> None:
        """Connect and list the tools, within `start_timeout` seconds."""
        self.status = "starting"
        self._task = asyncio.create_task(self._run(), name=f"mcp server {self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.start_timeout)
        except TimeoutError:
            self._fail(f"no answer within {self.start_timeout:g} s")
            await self._end_task(grace=0)

    async def _run(self) -> None:
        from mcp import Client

        try:
            async with Client(self._transport()) as client:
                tools, cursor = [], None
                while True:
                    listing = await client.list_tools(cursor=cursor)
                    tools += listing.tools
                    cursor = listing.next_cursor
                    if not cursor:
                        break
                self.tools = [
                    McpTool(self.name, t.name, t.description or "", dict(t.input_schema or {}))
                    for t in tools
                ]
                self._client, self.status = client, "ready"
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # reported in the chat; the other servers go on
            logger.info("MCP server %s failed", self.name, exc_info=True)
            self._fail(describe_error(exc))
        finally:
            self._client = None
            if self.status == "ready":
                self.status = "closed"
            self._ready.set()

    def _fail(self, error: str) -> None:
        if self.status in ("failed", "closed"):
            return
        last = self._stderr_tail()
        self.status, self.error = "failed", error + (f" (stderr: {last})" if last else "")

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
            return lines[-1][:200] if lines else ""
        return ""

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> ToolOutcome:
        """Run the tool `name`; a tool error, a lost server or `timeout` seconds without an answer
        is an outcome saying so, never an exception (a cancelled call is cancelled)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._client
        if client is None:
            return ToolOutcome("error", f"the MCP server {self.name!r} is not running")
        late = ToolOutcome("timeout", f"the tool {name!r} gave no answer within {timeout:g} s")
        try:
            # the SDK's own timeout first; ours in case a transport does not honour it
            result = await asyncio.wait_for(
                client.call_tool(name, arguments, read_timeout_seconds=timeout), timeout + 5
            )
        except TimeoutError:
            return late
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return late
            if exc.code == CONNECTION_CLOSED:  # the process ended, or the HTTP session did
                self._fail("closed the connection")
                self._stop.set()
                return ToolOutcome("error", f"the MCP server {self.name!r} {self.error}")
            return ToolOutcome("error", exc.message)
        except Exception as exc:
            logger.info("MCP tool %s/%s failed", self.name, name, exc_info=True)
            return ToolOutcome("error", describe_error(exc))
        text = result_text(result)
        return ToolOutcome("error" if result.is_error else "done", text)

    async def close(self) -> None:
        self._stop.set()
        await self._end_task()
        self._stderr.close()

    async def _end_task(self, grace: float = 10.0) -> None:
        """Let the task leave the client (which stops the process or ends the HTTP session) within
        `grace` seconds, else cancel it."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
