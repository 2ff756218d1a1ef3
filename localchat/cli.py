"""The `localchat` command: thin Typer wiring; each command's work lives in its own module."""

from __future__ import annotations

import typer

from localchat.generate_command import generate

app = typer.Typer(
    name="localchat",
    help="Chat with and serve open LLMs on your own machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(generate)
from localchat.tui.cli_entry import chat  # noqa: E402

app.command()(chat)
from localchat.server.command import serve  # noqa: E402

app.command()(serve)
from localchat.bench.command import bench  # noqa: E402

app.command()(bench)


from localchat.models import commands as model_commands  # noqa: E402

app.command()(model_commands.pull)
app.command("list")(model_commands.list_models)
app.command()(model_commands.show)
app.command()(model_commands.rm)
app.command()(model_commands.alias)
from localchat.multimodel.ps import ps  # noqa: E402

app.command()(ps)


@app.command()
def version() -> None:
    """Print the version."""
    from localchat import __version__

    typer.echo(f"localchat {__version__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
