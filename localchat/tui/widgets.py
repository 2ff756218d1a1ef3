"""The chat's controls: the prompt box, the loading panel and the list of conversations (the status
bar is in status_bar.py)."""

from __future__ import annotations

import time
from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, ListItem, ListView, ProgressBar, Static, TextArea


class PromptBox(TextArea):
    """Where the user types. Enter sends, Shift+Enter or Ctrl+J adds a line; Up on the first line
    and Down on the last walk through earlier prompts."""

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("placeholder", "Message  (Enter sends · Shift+Enter new line · /help)")
        super().__init__(soft_wrap=True, tab_behavior="focus", show_line_numbers=False, **kwargs)
        self.prompts: list[str] = []
        self._recall: int | None = None  # index into history while walking it
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def remember(self, text: str) -> None:
        if not self.prompts or self.prompts[-1] != text:
            self.prompts.append(text)
        self._recall = None

    def set_history(self, prompts: list[str]) -> None:
        self.prompts, self._recall = list(prompts), None

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.prompts and self._recall != 0:
            if self._recall is None:
                self._draft, self._recall = self.text, len(self.prompts)
            self._recall -= 1
            self._show(self.prompts[self._recall])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if (
            not select
            and self._recall is not None
            and self.cursor_location[0] == self.document.line_count - 1
        ):
            self._recall += 1
            if self._recall >= len(self.prompts):
                self._recall = None
                self._show(self._draft)
            else:
                self._show(self.prompts[self._recall])
            return
        super().action_cursor_down(select)

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)


class LoadingPanel(Vertical):
    """Shown while the model loads: what, for how long, the latest step reported, and a busy bar."""

    def __init__(self, what: str, **kwargs):
        super().__init__(**kwargs)
        self.what, self.last_step, self.started = what, "", time.monotonic()
        self.label = Static(f"{what}…", markup=False)

    def compose(self) -> ComposeResult:
        yield self.label
        yield ProgressBar(total=None, show_eta=False, show_percentage=False)

    def on_mount(self) -> None:
        self.set_interval(0.2, self.tick)

    def step(self, message: str) -> None:
        self.last_step = f"  ({message})"
        self.tick()

    def tick(self) -> None:
        self.label.update(f"{self.what}… {time.monotonic() - self.started:.1f} s{self.last_step}")


class ChatItem(ListItem):
    """One stored conversation in the ChatList, its id in the widget id ("chat-<id>")."""

    def __init__(self, item_id: str, title: str):
        self.label = Label(title, markup=False)
        super().__init__(self.label, id=item_id)
        self.title = title

    def retitle(self, title: str) -> None:
        if title != self.title:
            self.title = title
            self.label.update(title)


class ChatList(ListView):
    """The side list of stored conversations: Enter opens one, R renames it, Delete deletes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "rename", "Rename"),
        Binding("delete,d", "delete", "Delete"),
    ]

    class Action(Message):
        def __init__(self, action: str, conversation_id: int):
            super().__init__()
            self.action = action
            self.conversation_id = conversation_id

    async def show(self, conversations: list[tuple[int, str]], current: int | None) -> None:
        """Show `conversations` (id, title) in order, highlighting `current`. The items already
        shown are kept and retitled, and only the new ones are made: under Textual 8.2.8 a removed
        list item stays alive (reachable from its label's finished message task), so a list rebuilt
        at every new chat or switch would grow the heap by every item each time."""
        wanted = {f"chat-{cid}": title for cid, title in conversations}
        items = list(self.query_children(ChatItem))
        shown = {item.id: item for item in items}
        gone = [i for i, item in enumerate(items) if item.id not in wanted]
        if gone:
            await self.remove_items(gone)
        for position, (item_id, title) in enumerate(wanted.items()):
            item = shown.get(item_id)
            if item is None:
                await self.insert(position, [ChatItem(item_id, title)])
                continue
            item.retitle(title)
            if self.children[position] is not item:
                self.move_child(item, before=position)
        ids = [cid for cid, _ in conversations]
        if current in ids:
            self.index = ids.index(current)

    def _highlighted_id(self) -> int | None:
        item = self.highlighted_child
        return int(item.id.removeprefix("chat-")) if item is not None and item.id else None

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        if event.item.id:
            self.post_message(self.Action("open", int(event.item.id.removeprefix("chat-"))))

    def action_rename(self) -> None:
        if (cid := self._highlighted_id()) is not None:
            self.post_message(self.Action("rename", cid))

    def action_delete(self) -> None:
        if (cid := self._highlighted_id()) is not None:
            self.post_message(self.Action("delete", cid))
