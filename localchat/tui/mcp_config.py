"""`localchat chat --mcp servers.json`: the MCP servers a chat takes tools from, in the JSON shape
Claude Desktop and oterm read:

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-files", "."],
                              "env": {"KEY": "value"}},
                    "remote": {"url": "http://localhost:9000/mcp", "headers": {"X-Key": "k"}}}}

A server with `command` (and optional `args`, `env`, `cwd`) runs as a child process spoken to over
stdio; one with `url` (and optional `headers`) is reached over streamable HTTP. Other keys of the
file and of each entry (an `icon`, a `disabled` flag other clients write) are left alone, except
`disabled: true`, which leaves that server out, and `type`/`transport`, which must agree with the
entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import InvalidParameterError
from localchat.tui.json_files import read_json_file

_STDIO_TYPES = ("stdio",)
_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


@dataclass(frozen=True)
class McpServerSpec:
    """One entry of the file: a command to run (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """How the server is reached, in one line (for /tools)."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)


def _bad(where: str, problem: str) -> InvalidParameterError:
    return InvalidParameterError(f"--mcp: {where}: {problem}", param="mcp")


def _strings(value: Any, where: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad(where, f"{what} must be a list of strings")
    return list(value)


def _string_map(value: Any, where: str, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _bad(where, f"{what} must be an object of strings")
    return dict(value)


def _server(name: str, entry: Any, where: str) -> McpServerSpec | None:
    """The spec of one entry (None: `disabled`)."""
    if not isinstance(entry, dict):
        raise _bad(where, "must be an object with `command` or `url`")
    if entry.get("disabled") is True:
        return None
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise _bad(where, "needs either `command` (a stdio server) or `url` (streamable HTTP)")
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in (_STDIO_TYPES if command is not None else _HTTP_TYPES):
        if kind == "sse":
            raise _bad(where, "SSE servers are not supported; use the server's streamable HTTP URL")
        raise _bad(where, f"type {kind!r} does not go with `{'command' if command else 'url'}`")
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise _bad(where, "`command` must be a non-empty string")
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise _bad(where, "`cwd` must be a string")
        return McpServerSpec(
            name,
            command=command,
            args=_strings(entry.get("args", []), where, "`args`"),
            env=_string_map(entry.get("env", {}), where, "`env`"),
            cwd=cwd,
        )
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise _bad(where, "`url` must be an http:// or https:// URL")
    return McpServerSpec(
        name, url=url, headers=_string_map(entry.get("headers", {}), where, "`headers`")
    )


def parse_mcp_config(data: Any, source: str) -> list[McpServerSpec]:
    """The servers of a parsed file (`source` names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise _bad(source, 'must be a JSON object with "mcpServers": {"name": {...}, ...}')
    specs = []
    for name, entry in data["mcpServers"].items():
        if not name.strip():
            raise _bad(source, "a server's name is empty")
        spec = _server(name, entry, f"{source}: server {name!r}")
        if spec is not None:
            specs.append(spec)
    return specs


def load_mcp_config(path: str | Path) -> list[McpServerSpec]:
    """The servers of the file at `path`; a file that is missing, not JSON or not in the shape above
    raises an InvalidParameterError naming the problem in one line."""
    path = Path(path).expanduser()
    return parse_mcp_config(read_json_file(path, "--mcp", "mcp"), str(path))
