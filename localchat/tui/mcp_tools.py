"""McpTools: the MCP servers of `--mcp` and their tools, as the chat offers them to the model
(OpenAI-style `tools`) and runs them: started together when the chat starts, each failing server
reported and skipped, closed when the chat ends."""

from __future__ import annotations

import asyncio
import importlib
import re
from typing import Any

from localchat.tui.mcp_config import McpServerSpec
from localchat.tui.mcp_connection import McpConnection, McpTool, ToolOutcome

DEFAULT_TIMEOUT_S = 60.0  # a call with no answer by then is an error the model is told of
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_-]+")  # what OpenAI's function names may not hold


class McpTools:
    """The servers and their tools. Each tool is offered under a name the OpenAI API accepts (its
    own where it can be; else qualified with its server's name, so that two servers' tools of one
    name both stay callable). `always` holds the names the user allowed to run without asking."""

    def __init__(
        self,
        specs: list[McpServerSpec],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        start_timeout: float = 30.0,
    ):
        self.connections = [McpConnection(spec, start_timeout=start_timeout) for spec in specs]
        self.timeout = timeout
        self.always: set[str] = set()
        self.by_name: dict[str, McpTool] = {}

    async def start(self) -> None:
        """Start every server at once; the tools of those that started are then offered."""
        if self.connections:  # the SDK takes a second to import: not on the event loop
            await asyncio.to_thread(importlib.import_module, "mcp")
        await asyncio.gather(*(connection.start() for connection in self.connections))
        self.by_name = {}
        for connection in self.connections:
            for tool in connection.tools:
                self.by_name[self._free_name(tool)] = tool

    def _free_name(self, tool: McpTool) -> str:
        for candidate in (tool.name, f"{tool.server}_{tool.name}"):
            name = _NOT_A_NAME.sub("_", candidate)[:64]
            if name and name not in self.by_name:
                return name
        number = 2
        while f"{name[:60]}_{number}" in self.by_name:
            number += 1
        return f"{name[:60]}_{number}"

    @property
    def failed(self) -> list[McpConnection]:
        return [c for c in self.connections if c.status == "failed"]

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat request's `tools`."""
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": tool.description,
                    "parameters": tool.input_schema or {"type": "object", "properties": {}},
                },
            }
            for name, tool in self.by_name.items()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Run the tool offered as `name` with `timeout`; an unknown name is an error outcome."""
        tool = self.by_name.get(name)
        if tool is None:
            return ToolOutcome("error", f"there is no tool {name!r}")
        connection = next(c for c in self.connections if c.name == tool.server)
        return await connection.call(tool.name, arguments, self.timeout)

    def listing(self) -> str:
        """/tools: every server, how it is reached and how it stands, and its tools (which run
        without asking)."""
        if not self.connections:
            return "The --mcp file names no server."
        names = {id(tool): name for name, tool in self.by_name.items()}
        lines = []
        for connection in self.connections:
            spec = connection.spec
            state = connection.status
            if connection.error:
                state += f": {connection.error}"
            lines += [f"{spec.name}  ({spec.transport}: {spec.describe()})", f"  {state}"]
            for tool in connection.tools:
                name = names.get(id(tool), tool.name)
                shown = name if name == tool.name else f"{name} (the server's {tool.name})"
                always = "  [always allowed]" if name in self.always else ""
                lines.append(f"  • {shown}{always}")
                if tool.description:
                    lines.append(f"      {tool.description.strip().splitlines()[0]}")
            lines.append("")
        lines.append(f"A call that takes over {self.timeout:g} s is stopped and reported.")
        return "\n".join(lines)

    async def close(self) -> None:
        await asyncio.gather(*(connection.close() for connection in self.connections))
