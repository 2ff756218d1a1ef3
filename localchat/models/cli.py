"""The Typer commands `list`, `show`, `rm` and `alias` (localchat/cli.py registers them; `pull`,
which also prepares the model for the engine, is in engine/cli.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from localchat.cli_options import report_errors
from localchat.models.facts import format_parameters
from localchat.utils import format_bytes


@report_errors
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, for scripts")] = False,
) -> None:
    """List the models: the default, those in the Hugging Face cache, and aliases."""
    from localchat.models.registry import entries
    from localchat.models.show import summary

    rows = [summary(e) for e in entries()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = [("NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "SIZE", "WHERE")]
    for r in rows:
        table.append(
            (
                r["name"],
                r["family_label"],
                format_parameters(r["parameters"]),
                r["quantization"] or "-",
                str(r["context_length"] or "-"),
                format_bytes(r["size_bytes"]),
                r["path"],
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        typer.echo(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        )


@report_errors
def show(
    name: Annotated[str, typer.Argument(help="A name from `localchat list`")],
    as_json: Annotated[bool, typer.Option("--json", help="Everything, as JSON")] = False,
    template: Annotated[bool, typer.Option("--template", help="Only the chat template")] = False,
) -> None:
    """Show a model: what it is, its generation defaults, chat template and config."""
    from localchat.models.registry import lookup
    from localchat.models.show import describe

    info = describe(lookup(name))
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    if template:
        typer.echo(info["chat_template"] or "(no chat template)")
        return
    for key in ("name", "source", "format", "architecture"):
        typer.echo(f"  {key:<15}{info[key] or '-'}")
    typer.echo(f"  {'family':<15}{info['family'] or 'not supported by localchat'}")
    typer.echo(f"  {'parameters':<15}{format_parameters(info['parameters'])}")
    typer.echo(f"  {'quantization':<15}{info['quantization'] or '-'}")
    typer.echo(f"  {'context length':<15}{info['context_length'] or '-'}")
    typer.echo(f"  {'size':<15}{format_bytes(info['size_bytes'])}")
    typer.echo(f"  {'location':<15}{info['path']}")
    typer.echo("\nGeneration defaults (generation_config.json)")
    defaults = info["generation_defaults"]
    for key, value in defaults.items():
        typer.echo(f"  {key:<19}{value}")
    if not defaults:
        typer.echo("  none (requests that set nothing sample at temperature 1.0)")
    typer.echo("\nChat template")
    text = info["chat_template"] or "(none)"
    lines = text.splitlines()
    typer.echo("\n".join(f"  {line}" for line in lines[:12]))
    if len(lines) > 12:
        typer.echo(f"  ... ({len(lines)} lines; `localchat show {name} --template`)")
    typer.echo("\nConfig")
    for key, value in info["config"].items():
        typer.echo(f"  {key}: {json.dumps(value, default=str)}")


@report_errors
def rm(
    name: Annotated[str, typer.Argument(help="A name from `localchat list`")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Remove a model from disk (or an alias, keeping its model)."""
    from localchat.models.facts import facts_of
    from localchat.models.registry import lookup, read_aliases, remove, remove_alias

    is_alias = name in read_aliases()  # even one whose model is gone
    entry = None if is_alias else lookup(name)
    if entry is None:
        what = f"the alias {name} (its model is kept)"
    else:
        size = format_bytes(facts_of(entry.kind, entry.path).size_bytes)
        what = f"{entry.name} ({size}, {entry.path})"
    if not yes and not typer.confirm(f"remove {what}?", default=False):
        typer.echo("kept")
        raise typer.Exit(1)
    if entry is None:
        remove_alias(name)
    else:
        remove(entry)
    typer.echo(f"removed {name}")


@report_errors
def alias(
    name: Annotated[str, typer.Argument(help="The new name, e.g. coder or my-model:q4")],
    target: Annotated[str, typer.Argument(help="A model path or a name from `localchat list`")],
) -> None:
    """Give a model another name (`chat`, `serve` and the API's `model` accept it)."""
    from localchat.models.registry import add_alias

    entry = add_alias(name, target)
    typer.echo(f"{entry.name} -> {entry.source} ({entry.path})")
