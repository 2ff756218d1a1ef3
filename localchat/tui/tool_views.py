"""How an MCP tool call looks in the chat: a block in the conversation (the call, where it stands,
its result folded away) and the question whether to run it (yes / no / always for this tool)."""

from __future__ import annotations

import json
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Collapsible, Static

from localchat.tui.conversation import StoredMessage

# what the block says of a call in each state; `status` is also stored with a tool result
STATUS_TEXT = {
    "waiting": "waiting for your answer…",
    "running": "running… · Esc stops",
    "done": "✓ done",
    "error": "✗ failed",
    "timeout": "✗ timed out",
    "declined": "✗ declined: the model is told you said no",
    "stopped": "■ stopped",
}
# a result of at most this many lines is shown open; a longer one is folded
OPEN_RESULT_LINES = 6


def arguments_text(arguments: str, indent: int | None = None) -> str:
    """A call's arguments (JSON text) as they are shown: compact JSON on one line (or indented),
    the text as it is when it is not JSON."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments
    separators = (", ", ": ") if indent is None else None
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)


class ToolCallView(Vertical):
    """One tool call in the conversation: the tool and its arguments, its state, and its result
    (a collapsible block, open when short)."""

    def __init__(self, name: str, arguments: str, server: str | None = None):
        super().__init__(classes="message")
        self.border_title = f"⚙ {name}" + (f" · {server}" if server else "")
        self.arguments = Static(
            f"{name}({arguments_text(arguments)})", markup=False, classes="args"
        )
        self.status = Static("", markup=False, classes="status")
        self.result_text = Static("", markup=False, classes="result-text")
        self.result = Collapsible(self.result_text, title="Result", collapsed=False)
        self.result.display = False
        self.state = ""

    @classmethod
    def of_result(cls, message: StoredMessage) -> ToolCallView:
        """The block of a stored tool result (a conversation shown again, or resumed)."""
        meta = message.meta
        view = cls(meta.get("name") or "?", meta.get("arguments") or "", meta.get("server"))
        view.set_state(meta.get("status") or "done")
        view.show_result(message.content, meta.get("status") or "done")
        return view

    def compose(self) -> ComposeResult:
        yield self.arguments
        yield self.status
        yield self.result

    def set_state(self, state: str) -> None:
        self.remove_class(*(f"-{name}" for name in STATUS_TEXT))
        self.add_class(f"-{state}")
        self.state = state
        self.status.update(STATUS_TEXT.get(state, state))

    def show_result(self, text: str, state: str) -> None:
        """The call is over: its state and what the model is told."""
        self.set_state(state)
        if state in ("declined", "stopped"):
            return
        self.result_text.update(text or "(no output)")
        self.result.title = "Error" if state in ("error", "timeout") else "Result"
        self.result.collapsed = len(text.splitlines()) > OPEN_RESULT_LINES
        self.result.display = True


class ToolApprovalScreen(ModalScreen[str]):
    """Whether to run a call: "yes", "no" (the model is told), "always" (this tool runs from now on
    without asking, until the chat ends), or "stop" (Esc: the reply ends here)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer('yes')", "Yes"),
        Binding("n", "answer('no')", "No"),
        Binding("a", "answer('always')", "Always"),
        Binding("escape", "answer('stop')", "Stop"),
    ]

    def __init__(self, name: str, arguments: str, server: str, description: str = ""):
        super().__init__()
        self.name_, self.arguments, self.server, self.description = (
            name,
            arguments,
            server,
            description,
        )

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                f"Run the tool {self.name_} of the MCP server {self.server}?",
                classes="dialog-title",
                markup=False,
            )
            if self.description:
                yield Static(self.description.strip(), classes="hint", markup=False)
            yield Static(
                arguments_text(self.arguments, indent=2), id="tool-arguments", markup=False
            )
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="primary", id="yes")
                yield Button("No (n)", id="no")
                yield Button(f"Always for {self.name_} (a)", id="always")
            yield Static("Esc stops the reply.", classes="hint", markup=False)

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(str(event.button.id))

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)
