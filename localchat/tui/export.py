"""What the chat shows or writes about a conversation outside the chat view: its settings, its
export files."""

from __future__ import annotations

import re
from pathlib import Path

from localchat.tui.backends import ChatBackend
from localchat.tui.conversation import Conversation


def settings_text(
    conversation: Conversation,
    backend: ChatBackend,
    store_path: str | Path | None,
    json_mode: str | None = None,
) -> str:
    """The /show text: the model, the conversation, its system prompt and sampling settings, and
    what /json turned on (its label)."""
    think = "default" if conversation.think is None else ("on" if conversation.think else "off")
    lines = [
        f"model:          {backend.model_name} ({backend.description})",
        f"max_model_len:  {backend.max_model_len or '?'}",
        f"conversation:   {conversation.title} (id {conversation.id or 'not stored yet'})",
        f"store:          {store_path or 'in memory (--no-history)'}",
        f"system prompt:  {conversation.system_prompt or '(none)'}",
        f"think:          {think}",
        f"json:           {json_mode or 'off'}",
        "",
    ] + [f"{name + ':':<16}{value}" for name, value in conversation.settings.items()]
    return "\n".join(lines)


def export_conversation(conversation: Conversation, path: str = "") -> tuple[Path, Path]:
    """Write the conversation as PATH.md and PATH.json (default: ./localchat-TITLE); returns both
    paths."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-").lower()[:40] or "chat"
    base = Path(path).expanduser() if path else Path.cwd() / f"localchat-{slug}"
    base = base.with_suffix("") if base.suffix in (".md", ".json") else base
    markdown, json_path = base.with_name(base.name + ".md"), base.with_name(base.name + ".json")
    base.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(conversation.to_markdown(), encoding="utf-8")
    json_path.write_text(conversation.to_json(), encoding="utf-8")
    return markdown, json_path
