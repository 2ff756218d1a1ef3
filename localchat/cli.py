"""The `localchat` command: thin Typer wiring. Each command lives in its package's `cli.py`
(`generate` and `pull` in engine/, `chat` in tui/, `serve` in server/, `bench` in bench/,
`list`/`show`/`rm`/`alias` in models/, `ps` in server/multimodel/)."""

from __future__ import annotations

import typer

from localchat.bench.cli import bench
from localchat.cli_help import NarrowHelpCommand
from localchat.engine.cli import generate, pull
from localchat.models import cli as models_cli
from localchat.server.cli import serve
from localchat.server.multimodel.cli import ps
from localchat.tui.cli import chat

app = typer.Typer(
    name="localchat",
    help="Chat with and serve open LLMs on your own machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
for command, name in (
    (generate, None),
    (chat, None),
    (serve, None),
    (bench, None),
    (pull, None),
    (models_cli.list_models, "list"),
    (models_cli.show, None),
    (models_cli.rm, None),
    (models_cli.alias, None),
    (ps, None),
):
    app.command(name, cls=NarrowHelpCommand)(command)


@app.command(cls=NarrowHelpCommand)
def version() -> None:
    """Print the version."""
    from localchat import __version__

    typer.echo(f"localchat {__version__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
