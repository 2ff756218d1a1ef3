"""`localchat ps`: which models a running server has loaded, their memory, how long each has been
idle and when it will be unloaded."""

from __future__ import annotations

from typing import Annotated

import typer

from localchat import envs
from localchat.cli_options import report_errors
from localchat.errors import LocalchatError
from localchat.server.keep_alive import format_duration
from localchat.utils import format_bytes


@report_errors
def ps(
    url: Annotated[str, typer.Option("--url", help="The server")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar=envs.API_KEY.name, show_default=False)
    ] = None,
) -> None:
    """Show a `localchat serve` server's models: memory, idle time, when each unloads."""
    from localchat.client import APIError, Client

    try:
        with Client(url, api_key=api_key or "", timeout=5) as client:
            cards = client.model_cards()
    except (APIError, ValueError, KeyError, TypeError) as exc:
        reason = exc.describe() if isinstance(exc, APIError) else exc
        raise LocalchatError(f"no localchat server answered at {url}: {reason}") from None
    rows = [("NAME", "LOADED", "MEMORY", "CONTEXT", "IDLE", "UNTIL")]
    for card in cards:
        loaded = card.get("loaded", True)  # a single-model server has its one model loaded
        idle, memory = card.get("idle_seconds"), card.get("memory_bytes")
        rows.append(
            (
                str(card.get("id")),
                "yes" if loaded else "no",
                "-" if memory is None else format_bytes(memory).replace(" ", ""),
                str(card.get("max_model_len") or "-"),
                "-" if idle is None else format_duration(idle),
                _until(card) if loaded else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _until(card: dict) -> str:
    """When the model unloads: 'in 4m 50s', 'forever' (kept, or a single-model server), 'busy'."""
    if card.get("busy"):
        return "busy"
    unloads = card.get("unloads_in_seconds")
    return "forever" if unloads is None else f"in {format_duration(unloads)}"
