"""The conversation's widgets: user messages, streamed assistant replies, and notices."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import ScrollableContainer, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static

from localchat.tui.attachments import shown_text
from localchat.tui.conversation import StoredMessage, tool_call_line
from localchat.tui.session import reply_meta_text
from localchat.tui.tool_views import ToolCallView

# What the line under a reply says while the reply can still be stopped (Esc is not in the footer:
# see chat_screen's _FOOTER)
STOP_HINT = " · Esc stops"


class UserMessage(Static):
    """A user message, shown as typed. `position` is its index in the conversation."""

    def __init__(self, text: str, position: int):
        super().__init__(text, markup=False, classes="message")
        self.position = position
        self.border_title = "You"


class Notice(Static):
    """A line from localchat itself inside the conversation: a dropped-context notice or an
    error."""

    def __init__(self, text: str, *, error: bool = False):
        super().__init__(text, markup=False, classes="error" if error else "")


class StreamingText(Static):
    """Plain text that grows while a reply streams. Repainting it is cheap; a change of its height
    asks Textual for a new layout (a reflow and repaint of the whole screen, the chat's largest cost
    per token), so its height grows ahead of the text, by half the conversation's height (between
    MIN_RESERVE and MAX_RESERVE lines), and never shrinks while it streams: one layout per that many
    lines written."""

    # 16 lines at most, not 8: on a 40-row terminal, a reply of the default model's speed then lays
    # the screen out about half as often (chat/engine 0.93x -> 0.96x, benchmarks/chat_vs_engine.py);
    # on a short terminal half its height, so the text being written stays in view
    MIN_RESERVE, MAX_RESERVE = 8, 16

    def __init__(self, text: str = "", **kwargs):
        super().__init__(text, markup=False, **kwargs)
        self._reserved = 0

    def show(self, text: str) -> None:
        """Show `text`, growing the reservation if it no longer fits."""
        if self.needs_room(text):
            self.grow()

    def grow(self) -> None:
        """Reserve `reserve_lines() - 1` lines beyond the text shown (one layout)."""
        self._reserved = self._height() + self.reserve_lines() - 1
        self.styles.min_height = self._reserved

    def reserve_lines(self) -> int:
        """Lines to reserve at a time: half the height of the scrolling view it is in."""
        view = next((a for a in self.ancestors if isinstance(a, ScrollableContainer)), self.screen)
        return max(self.MIN_RESERVE, min(self.MAX_RESERVE, view.size.height // 2))

    def needs_room(self, text: str) -> bool:
        """Show `text` without a new layout; True when it is taller than the lines reserved (the
        next show() will lay the screen out). Before its first layout, when its width is not known,
        it asks for one and answers False."""
        self.update(text, layout=False)
        height = self._height()
        if height < 0:
            self.refresh(layout=True)
            return False
        return height > self._reserved

    def _height(self) -> int:
        width = self.size.width
        # Textual's own Widget passes its styles here too; get_height is annotated as taking the
        # RulesMap TypedDict, which RenderStyles is not
        return self.visual.get_height(self.styles, width) if width else -1  # type: ignore[arg-type]

    def rewind(self) -> None:
        """The text starts over: reserve `reserve_lines()` for it afresh (call it where the screen
        is laid out anyway, so the change costs no layout of its own)."""
        self._reserved = self.reserve_lines()
        self.styles.min_height = self._reserved

    def release(self) -> None:
        """Give back the reserved lines (the text is complete)."""
        self._reserved = 0
        self.styles.min_height = None


def block_end(text: str) -> int:
    """Where the complete Markdown blocks of `text` end: after its last blank line (or closing code
    fence) outside a fenced code block; 0 when no block is complete yet."""
    end = position = 0
    fenced = False
    for line in text.splitlines(keepends=True):
        position += len(line)
        if not line.endswith("\n"):
            break
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
            if not fenced:
                end = position
        elif not stripped and not fenced:
            end = position
    return end


class AssistantMessage(Vertical):
    """A reply: a collapsible thinking block, the answer as Markdown, the tool calls a server
    parsed out of it (a block of their own), and a line of facts about the turn.

    While streaming, the text not yet in the Markdown shows as plain text below it (the tail). When
    the tail outgrows its reserved lines, its complete blocks (paragraphs, closed code fences) move
    to the Markdown in the same layout, so most paints re-parse nothing and change no layout.
    `finish()` renders the whole answer once more and collapses the thinking.
    """

    def __init__(self, message: StoredMessage | None = None, title: str = "Assistant"):
        super().__init__(classes="message")
        self.message = message
        self.border_title = title
        self.thinking = message.thinking if message else ""
        self._shown_text, self._finished, self._answering = 0, False, False
        self._pending = ""  # the answer's block being written, shown in `tail` until it is complete
        done = message is not None
        self.thinking_text = StreamingText(self.thinking, classes="thinking-text")
        self.thinking_block = Collapsible(self.thinking_text, title="Thinking", collapsed=done)
        self.thinking_block.display = bool(self.thinking)
        self.markdown = Markdown(message.content if message else "")
        self.tail = StreamingText(classes="tail")
        self.tail.display = False
        self.calls_text = ""
        self.calls = Static("", markup=False, classes="tool-calls")
        self.calls.display = False
        if message is not None:
            self._show_calls(message)
        waiting = "waiting for the first token…" + STOP_HINT
        self.meta = Static(
            self._meta_text(message) if message is not None else waiting,
            markup=False,
            classes="meta",
        )
        if message is not None and message.stopped:
            self.add_class("stopped")

    def compose(self) -> ComposeResult:
        yield self.thinking_block
        yield self.markdown
        yield self.tail
        yield self.calls
        yield self.meta

    @staticmethod
    def _meta_text(message: StoredMessage) -> str:
        text = reply_meta_text(message.meta)
        if message.stopped:
            text = "■ stopped" + (f" · {text}" if text else "")
        return text

    def _show_calls(self, message: StoredMessage) -> bool:
        """Show the message's tool calls, one line each; False when they did not change."""
        text = "\n".join(tool_call_line(call) for call in message.tool_calls)
        if text == self.calls_text:
            return False
        self.calls_text = text
        self.calls.update(text)
        self.calls.display = bool(text)
        return True

    def set_meta(self, text: str) -> None:
        """The line under a streaming reply; one line long, so it never needs a new layout."""
        self.meta.update(text, layout=False)

    async def catch_up(self, message: StoredMessage) -> bool:
        """Append what `message` gained since the last call; False when there was nothing new."""
        if self._finished:
            return False
        thinking, text = message.thinking[len(self.thinking) :], message.content[self._shown_text :]
        self._shown_text = len(message.content)
        await self.add(thinking, text)
        calls = self._show_calls(message)
        return bool(thinking or text or calls)

    async def add(self, thinking: str, text: str) -> None:
        """Append a streamed piece of thinking and/or answer."""
        if thinking:
            self.thinking += thinking
            self.thinking_block.display = True
            self.thinking_text.show(self.thinking)
        if text:
            if not self._answering:
                self._answering = True
                if self.thinking:
                    self.thinking_block.collapsed = True  # thinking hides once the answer starts
                self.thinking_text.release()
                self.tail.display = True
            self._pending += text
            # complete blocks move to the Markdown when the tail runs out of room: that layout is
            # needed anyway, so the append costs none of its own
            if self.tail.needs_room(self._pending.rstrip("\n")):
                if end := block_end(self._pending):
                    await self.markdown.append(self._pending[:end])
                    self._pending = self._pending[end:]
                    self.tail.rewind()
                    self.tail.show(self._pending.rstrip("\n"))
                else:
                    self.tail.grow()

    async def finish(self, message: StoredMessage) -> None:
        """The reply is over (done, stopped or failed): render it once more, whole, and say how it
        went."""
        self.message, self._finished = message, True
        self.tail.display, self._pending = False, ""
        self.tail.release()
        self.thinking_text.release()
        await self.markdown.update(message.content)
        if message.thinking != self.thinking:
            self.thinking = message.thinking
            self.thinking_text.update(self.thinking)
            self.thinking_block.display = bool(self.thinking)
        if self.thinking:
            self.thinking_block.collapsed = True
        self._show_calls(message)
        self.set_class(message.stopped, "stopped")
        self.meta.update(self._meta_text(message))


def _message_widget(message: StoredMessage, position: int) -> Widget:
    if message.role == "user":
        return UserMessage(shown_text(message.content, message.meta), position)
    if message.role == "tool":
        return ToolCallView.of_result(message)
    return AssistantMessage(message)


class ConversationView(VerticalScroll):
    """The scrolling conversation. Anchored: it follows a streaming reply until the user scrolls up,
    and every new message brings it back to the bottom."""

    async def show(self, messages: list[StoredMessage], welcome: str) -> None:
        """Show a whole conversation (or the welcome text when it is empty), from scratch."""
        await self.remove_children()
        widgets = [_message_widget(m, i) for i, m in enumerate(messages)]
        await self.mount_all(widgets or [Static(welcome, id="welcome", markup=False)])
        self.scroll_end(animate=False, immediate=True)
        self.anchor()

    async def add(self, widget, *, before=None) -> None:
        for welcome in self.query("#welcome"):
            await welcome.remove()
        await self.mount(widget, before=before)
        self.anchor()
