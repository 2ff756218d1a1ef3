"""`--help` that stays readable in a narrow terminal.

Typer's rich help lays options out as a table of six columns; below about 92 columns it cuts the
longest names ("--tensor-parallel-…"). Below RICH_MIN_COLUMNS the help is click's plain text
instead, still under the panels' headings: every option name whole, its help wrapped below it.
"""

from __future__ import annotations

import os

import click
from typer.core import TyperCommand

RICH_MIN_COLUMNS = 100  # the rich table fits every option name whole from 92 columns on


def terminal_columns() -> int:
    """The width Typer's rich help would draw at: TERMINAL_WIDTH, else COLUMNS, else the
    terminal's, else 80."""
    from rich.console import Console

    forced = os.environ.get("TERMINAL_WIDTH", "")
    return int(forced) if forced.isdigit() else Console().width


class NarrowHelpCommand(TyperCommand):
    """A Typer command whose help is plain text in a terminal narrower than RICH_MIN_COLUMNS."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if terminal_columns() >= RICH_MIN_COLUMNS:
            return super().format_help(ctx, formatter)
        return click.Command.format_help(self, ctx, formatter)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Arguments, then each panel's options under its heading (the panel-less ones first)."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            # Typer escapes "[default: ...]" for rich markup; plain text shows it as it is
            record = (record[0], record[1].replace("\\[", "["))
            if param.param_type_name == "argument":
                heading = "Arguments"
            else:
                heading = getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(heading, []).append(record)
        first = {"Arguments": sections.pop("Arguments", []), "Options": sections.pop("Options", [])}
        for heading, records in {**first, **sections}.items():
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)
