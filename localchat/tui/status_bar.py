"""The chat's state and the one-line status bar that shows it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget


class ChatState(Enum):
    """Where the chat is: the model loading, waiting for a message, writing a reply, or failed to
    start."""

    LOADING = "loading"
    IDLE = "idle"
    GENERATING = "generating"
    ERROR = "error"


@dataclass(frozen=True)
class StatusInfo:
    """What the status bar shows (None: unknown or not applicable). Frozen: a change is a new value,
    so the bar repaints only when something it shows changed."""

    model: str = "?"
    state: ChatState = ChatState.LOADING
    ttft: float | None = None
    tokens_per_s: float | None = None
    context_tokens: int | None = None
    max_model_len: int | None = None
    context_warning: bool = False
    kv_cache_usage: float | None = None
    prefix_cache_hits: int | None = None
    # speculative decoding: the share of drafted tokens kept, and how many were drafted
    spec_acceptance: float | None = None
    spec_drafted: int | None = None
    json_mode: str | None = None  # /json's label ("JSON", "JSON city.json") while it is on


_STATE_STYLES = {
    ChatState.LOADING: "yellow",
    ChatState.IDLE: "green",
    ChatState.GENERATING: "bold cyan",
    ChatState.ERROR: "bold red",
}


class StatusBar(Widget):
    """One live line: model, state, speed of the current reply, context and KV-cache use. It
    repaints when `info` changes (a reactive, never polled), and never asks for a new layout: it is
    one line tall."""

    info: reactive[StatusInfo] = reactive(StatusInfo, layout=False)

    def render(self) -> Text:
        info = self.info
        parts = [
            Text(info.model, style="bold"),
            Text(f"● {info.state.value}", style=_STATE_STYLES[info.state]),
        ]
        if info.json_mode is not None:
            parts.append(Text(f"{{}} {info.json_mode}", style="bold magenta"))
        if info.ttft is not None:
            parts.append(Text(f"TTFT {info.ttft:.2f} s"))
        if info.tokens_per_s is not None:
            parts.append(Text(f"{info.tokens_per_s:.1f} tok/s"))
        if info.max_model_len:
            used = "?" if info.context_tokens is None else str(info.context_tokens)
            parts.append(
                Text(
                    f"ctx {used}/{info.max_model_len}"
                    + (" ⚠ nearly full" if info.context_warning else ""),
                    style="bold yellow" if info.context_warning else "",
                )
            )
        if info.kv_cache_usage is not None:
            parts.append(Text(f"KV {info.kv_cache_usage:.0%}"))
        if info.prefix_cache_hits is not None:
            parts.append(Text(f"prefix hits {info.prefix_cache_hits} tok"))
        if info.spec_acceptance is not None:
            parts.append(Text(f"spec {info.spec_acceptance:.0%} of {info.spec_drafted} drafted"))
        return Text(" │ ", style="dim").join(parts)
