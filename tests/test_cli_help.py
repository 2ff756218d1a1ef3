"""The commands' --help in an 80-column terminal, and the CLI's one-line errors for bad options."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from localchat.cli import app

COMMANDS = ["serve", "chat", "bench", "generate"]


def _names(command: str) -> list[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    params = group.commands[command].params
    return [name for p in params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_option_name_whole(command, columns):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    for name in _names(command):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output), name
    if columns == 80:
        assert max(len(line) for line in result.output.splitlines()) <= 80


@pytest.mark.parametrize("port", ["-1", "65536", "99999"])
def test_serve_refuses_a_port_out_of_range_in_one_line(port):
    result = CliRunner().invoke(app, ["serve", "--port", port])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0] and "Traceback" not in result.output
