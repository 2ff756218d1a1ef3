"""Modal screens: help, a read-only text view (settings, rendered prompt), text input, sampling
settings, the model picker."""

from __future__ import annotations

from typing import ClassVar

from rich import box
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from localchat.errors import LocalchatError
from localchat.tui.commands import PROMPT_KEYS, help_rows, parse_setting
from localchat.tui.conversation import SETTING_NAMES


def _table(headers: tuple[str, ...], rows) -> Table:
    table = Table(*headers, box=box.SIMPLE_HEAD, expand=True, header_style="bold", padding=(0, 1))
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and slash commands."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide"):
            yield Static("localchat — keys and commands  (Esc closes)", classes="dialog-title")
            yield Static(_table(("Key", "In the prompt box"), PROMPT_KEYS))
            yield Static(_table(("Command", "Key", "Does"), help_rows()))
            yield Static(
                "Start a message with // to send a literal /.", classes="hint", markup=False
            )


class TextScreen(ModalScreen[None]):
    """A titled block of text to read, select and copy (the rendered prompt, the settings)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "Close")]

    def __init__(self, title: str, text: str):
        super().__init__()
        self.title_text, self.text = title, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide tall"):
            yield Static(f"{self.title_text}  (Esc closes)", classes="dialog-title", markup=False)
            yield TextArea(self.text, read_only=True, soft_wrap=True, id="text-view")


class InputScreen(ModalScreen[str | None]):
    """Ask for a text: one line (Enter accepts) or several (Ctrl+S accepts). Esc cancels (None)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "accept", "Accept", priority=True),
    ]

    def __init__(self, title: str, text: str = "", *, multiline: bool = False):
        super().__init__()
        self.title_text, self.text, self.multiline = title, text, multiline

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            hint = "Ctrl+S accepts" if self.multiline else "Enter accepts"
            yield Static(
                f"{self.title_text}  ({hint}, Esc cancels)", classes="dialog-title", markup=False
            )
            if self.multiline:
                yield TextArea(self.text, soft_wrap=True, id="input-text")
            else:
                yield Input(self.text, id="input-line")

    def on_mount(self) -> None:
        if self.multiline:
            area = self.query_one("#input-text", TextArea)
            area.focus()
            area.move_cursor(area.document.end)
        else:
            self.query_one("#input-line", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_accept(self) -> None:
        if self.multiline:
            self.dismiss(self.query_one("#input-text", TextArea).text)
        else:
            self.dismiss(self.query_one("#input-line", Input).value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SettingsScreen(ModalScreen[dict | None]):
    """Edit the sampling parameters; each value is checked as /set checks it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "accept", "Save", priority=True),
    ]

    def __init__(self, settings: dict):
        super().__init__()
        self.settings = dict(settings)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                "Sampling settings  "
                "(Enter or Ctrl+S saves, Esc cancels; empty seed/max_tokens: none)",
                classes="dialog-title",
            )
            for name in SETTING_NAMES:
                value = self.settings.get(name)
                with Horizontal(classes="setting"):
                    yield Label(name, classes="setting-name")
                    yield Input("" if value is None else str(value), id=f"setting-{name}")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_input_submitted(self) -> None:
        self.action_accept()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_accept() if event.button.id == "save" else self.action_cancel()

    def action_accept(self) -> None:
        settings = dict(self.settings)
        try:
            for name in SETTING_NAMES:
                raw = self.query_one(f"#setting-{name}", Input).value.strip() or "none"
                _, settings[name] = parse_setting(f"{name} {raw}", settings)
        except LocalchatError as exc:
            self.query_one("#settings-error", Static).update(exc.message)
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ModelPicker(ModalScreen[str | None]):
    """Pick the model to chat on with: the installed ones (or a server's), the current one first
    highlighted. Enter picks, Esc cancels (None)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, choices: list[tuple[str, str]], current: str):
        super().__init__()
        self.choices, self.current = choices, current

    def compose(self) -> ComposeResult:
        options = []
        for name, about in self.choices:
            prompt = Text(name, style="bold")
            if about:
                prompt.append(f"  {about}", style="dim")
            if name == self.current:
                prompt.append("  (current)", style="italic")
            options.append(Option(prompt, id=name))
        with Vertical(classes="dialog"):
            yield Static("Switch model  (Enter picks, Esc cancels)", classes="dialog-title")
            yield OptionList(*options, id="model-list")
            yield Static("The conversation keeps its history.", classes="hint", markup=False)

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        names = [name for name, _ in self.choices]
        options.highlighted = names.index(self.current) if self.current in names else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
