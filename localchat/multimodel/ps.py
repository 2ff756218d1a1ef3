"""`localchat ps`: which models a running server has loaded, and for how long each has been idle."""

from __future__ import annotations

from typing import Annotated

import typer

from localchat.cli_options import report_errors
from localchat.errors import LocalchatError


@report_errors
def ps(
    url: Annotated[str, typer.Option("--url", help="The server")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="LOCALCHAT_API_KEY", show_default=False)
    ] = None,
) -> None:
    """Show the models a `localchat serve-models` (or `serve`) server has loaded."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=5)
        response.raise_for_status()
        cards = response.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise LocalchatError(f"no localchat server answered at {url}: {exc}") from None
    rows = [("NAME", "LOADED", "CONTEXT", "IDLE")]
    for card in cards:
        loaded = card.get("loaded", True)  # a single-model server has its one model loaded
        idle = card.get("idle_seconds")
        rows.append(
            (
                str(card.get("id")),
                "yes" if loaded else "no",
                str(card.get("max_model_len") or "-"),
                "-" if idle is None else f"{idle:.0f} s",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
