"""The chat's commands: one table serves slash commands, key bindings, the command palette and
/help."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import InvalidParameterError, LocalchatError
from localchat.tui.conversation import SETTING_NAMES


@dataclass(frozen=True)
class Command:
    """A chat command: `/name args` in the prompt, `action` on the app (run with the argument text),
    an optional key, and whether the command palette offers it (commands that need an argument
    don't)."""

    name: str
    label: str
    help: str
    action: str
    usage: str = ""
    key: str | None = None
    aliases: tuple[str, ...] = ()
    palette: bool = True


COMMANDS: tuple[Command, ...] = (
    Command("help", "Help", "List the keys and commands", "help", key="f1", aliases=("?",)),
    Command("new", "New chat", "Start a new chat", "new_chat", key="ctrl+n"),
    Command("clear", "Clear", "Clear this chat's messages", "clear_chat", key="ctrl+l"),
    Command(
        "regen",
        "Regenerate",
        "Regenerate the last reply",
        "regenerate",
        key="ctrl+r",
        aliases=("regenerate", "retry"),
    ),
    Command(
        "edit",
        "Edit & resend",
        "Edit a user message and resend it in a new branch (N counts from 1; default: the last)",
        "edit",
        usage="[N]",
        key="ctrl+t",
    ),
    Command(
        "system",
        "System prompt",
        "Set the system prompt (no text: edit it; 'none' removes it)",
        "system",
        usage="[TEXT]",
        key="f4",
    ),
    Command(
        "set",
        "Settings",
        "Set a sampling parameter (" + ", ".join(SETTING_NAMES) + "), or speculative "
        "ngram|suffix|off; no argument: edit them all",
        "set",
        usage="[NAME VALUE]",
        key="f2",
        aliases=("settings",),
    ),
    Command(
        "think",
        "Thinking",
        "Thinking models: pass enable_thinking on or off (default: the template's)",
        "think",
        usage="on|off|default",
        palette=False,
    ),
    Command(
        "json",
        "JSON replies",
        "Constrain the next replies to JSON: any object, or the JSON schema in a file; "
        "'off' frees them",
        "json",
        usage="[FILE|off]",
        palette=False,
    ),
    Command(
        "image",
        "Attach image",
        "Attach an image file (PNG, JPEG, WebP, GIF) to the next message, or send it at once "
        "with TEXT; for vision-language models",
        "image",
        usage="PATH [TEXT]",
        palette=False,
    ),
    Command(
        "model",
        "Switch model",
        "Chat on with another model, keeping the history (no name: pick an installed one)",
        "model",
        usage="[NAME]",
        key="f8",
        aliases=("models",),
    ),
    Command(
        "tools",
        "Tools",
        "List the MCP servers of --mcp, their tools, and which run without asking",
        "tools",
        aliases=("mcp",),
    ),
    Command(
        "show", "Show settings", "Show the current settings", "show_settings", aliases=("info",)
    ),
    Command(
        "prompt",
        "Prompt",
        "Show the exact rendered prompt of the last reply (or of the next one)",
        "show_prompt",
        key="f3",
    ),
    Command("copy", "Copy reply", "Copy the last reply to the clipboard", "copy_reply", key="f5"),
    Command(
        "save",
        "Export",
        "Export this chat to Markdown and JSON (PATH without extension; default: "
        "./localchat-TITLE)",
        "save",
        usage="[PATH]",
        key="ctrl+s",
        aliases=("export",),
    ),
    Command(
        "chats",
        "Chats",
        "Show or hide the list of conversations (Enter opens, R renames, Del deletes)",
        "toggle_chats",
        key="ctrl+b",
        aliases=("history", "list"),
    ),
    Command("rename", "Rename", "Rename this chat", "rename", usage="[TITLE]"),
    Command("delete", "Delete", "Delete this chat", "delete_chat", palette=False),
    Command(
        "stop",
        "Stop",
        "Stop the reply being written (the partial reply is kept)",
        "stop",
        key="escape",
        palette=False,
    ),
    Command("quit", "Quit", "Quit", "quit", key="ctrl+q", aliases=("exit", "q")),
)

_BY_NAME = {alias: c for c in COMMANDS for alias in (c.name, *c.aliases)}


class UnknownCommandError(LocalchatError):
    """A slash command that does not exist."""


def parse_slash(text: str) -> tuple[Command, str] | None:
    """(command, argument text) for '/name args'; None when `text` is not a command ('//x' sends
    '/x')."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, args = text[1:].strip().partition(" ")
    command = _BY_NAME.get(name.lower())
    if command is None:
        raise UnknownCommandError(f"unknown command /{name}; /help lists them")
    return command, args.strip()


def unescape(text: str) -> str:
    return text[1:] if text.startswith("//") else text


_INTS = ("top_k", "max_tokens", "seed")


def parse_setting(args: str, settings: dict) -> tuple[str, object]:
    """Validate '/set NAME VALUE' against the current settings; returns (name, value) or raises."""
    name, _, raw = args.strip().partition(" ")
    name, raw = name.lower().replace("-", "_"), raw.strip()
    if name not in SETTING_NAMES:
        raise InvalidParameterError(
            f"unknown setting {name!r}; one of {', '.join(SETTING_NAMES)}", param=name
        )
    if not raw:
        raise InvalidParameterError(f"/set {name} needs a value", param=name)
    if raw.lower() in ("none", "default", "off") and name in ("seed", "max_tokens"):
        value = None
    else:
        try:
            value = int(raw) if name in _INTS else float(raw)
        except ValueError:
            kind = "an integer" if name in _INTS else "a number"
            raise InvalidParameterError(f"{name} must be {kind}, got {raw!r}", param=name) from None
    SamplingParams(**{**settings, name: value})  # raises naming the allowed range
    return name, value


def parse_think(args: str) -> bool | None:
    value = args.strip().lower()
    choices = {
        "on": True,
        "true": True,
        "1": True,
        "off": False,
        "false": False,
        "0": False,
        "default": None,
    }
    if value not in choices:
        raise InvalidParameterError("/think takes on, off or default", param="think")
    return choices[value]


PROMPT_KEYS = (
    ("Enter", "Send"),
    ("Shift+Enter, Ctrl+J", "New line"),
    ("Up / Down", "Earlier / later prompts (on the first / last line)"),
    ("Ctrl+P", "Command palette"),
)


def help_rows() -> list[tuple[str, str, str]]:
    """(slash command, key, what it does) for the help screen."""
    return [(f"/{c.name} {c.usage}".strip(), key_label(c.key), c.help) for c in COMMANDS]


def key_label(key: str | None) -> str:
    """'ctrl+n' -> 'Ctrl+N', 'escape' -> 'Esc', 'f1' -> 'F1'."""
    names = {"ctrl": "Ctrl", "shift": "Shift", "alt": "Alt", "escape": "Esc", "enter": "Enter"}
    return "+".join(names.get(part, part.upper()) for part in key.split("+")) if key else ""
