"""A small MCP server for the chat's tests, on the official `mcp` SDK: `add` answers, `fail` fails
(a tool error), `sleep` never answers in time (the chat's timeout stops it), `crash` ends the
server. `python mcp_server.py` serves over stdio; `python mcp_server.py http` over streamable HTTP
on a free port of 127.0.0.1, which it prints first (`PORT 12345`)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("localchat-test")


# small numbers: a call forced on the tiny model stays short (and whole within max_tokens)
Small = Annotated[int, Field(ge=0, le=99)]


@server.tool()
def add(a: Small, b: Small) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail() -> str:
    """Check the disk (always fails)."""
    raise ToolError("the disk is on fire")


@server.tool()
async def sleep() -> str:
    """Wait for a long time."""
    await asyncio.sleep(3600)
    return "awake"


@server.tool()
def crash() -> str:
    """End the server at once."""
    os._exit(3)


# Each tool takes only the arguments it names, as the schemas of many servers say (zod's, for one):
# a call forced on the tiny model is then `{}` for the tools that take none, not any object.
for _tool in server._tool_manager._tools.values():
    _tool.parameters["additionalProperties"] = False


def serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        serve_http()
    else:
        server.run()
