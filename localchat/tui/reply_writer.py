"""ReplyWriter: one streamed reply, from the backend's deltas to the stored message and the widget
showing it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from textual.timer import Timer
from textual.widget import Widget

from localchat.errors import LocalchatError
from localchat.tui.backends import ChatBackend, ChatRequest, ReplyStats
from localchat.tui.conversation import StoredMessage, ToolCallFold
from localchat.tui.messages import STOP_HINT, AssistantMessage
from localchat.tui.session import ChatSession

logger = logging.getLogger("localchat.tui")
# How often a reply being streamed is written to the store (what survives a kill).
SAVE_EVERY_S = 1.0
# How often streamed text reaches the screen. The engine shares the machine's cores with the UI, so
# each paint (and the frame Textual draws after it) is time the engine loses; once per token would
# cost it ~15%, and 10 paints a second about 10% (benchmarks/chat_vs_engine.py).
PAINT_EVERY_S = 0.15
# A paint is skipped while the event loop has used more than this share of a core since the last
# one (a paint that laid the screen out costs several times one that did not), but never for longer
# than PAINT_AT_LEAST_EVERY_S: the UI's cost stays bounded whatever Textual has to redo.
UI_CPU_BUDGET = 0.05
PAINT_AT_LEAST_EVERY_S = 0.5


class ReplyWriter:
    """Streams one reply into `view`: every delta is folded into the message and its ReplyStats at
    once (cheap); the view is painted at most every PAINT_EVERY_S, less often while the UI is over
    its CPU budget, and the message stored every SAVE_EVERY_S. A stop (the task cancelled) or a
    failure keeps what was written, marked; an empty reply is removed."""

    def __init__(
        self,
        session: ChatSession,
        backend: ChatBackend,
        view: AssistantMessage,
        on_paint: Callable[[ReplyStats], None],
    ):
        self.session, self.backend, self.view, self.on_paint = session, backend, view, on_paint
        self.message = StoredMessage("assistant", "")
        self.stats = ReplyStats()
        self.stopped = False
        self.error: str | None = None
        self._calls = ToolCallFold(self.message)  # the tool calls a server parsed
        self._last_paint = time.monotonic(), time.thread_time()

    async def write(self, request: ChatRequest, clock_owner: Widget) -> None:
        """Stream the reply to `request`; `clock_owner` runs the paint timer."""
        message, stats, session = self.message, self.stats, self.session
        message.meta["model"] = self.backend.model_name  # which model wrote it
        position = session.add_reply(message)
        painter: Timer = clock_owner.set_interval(PAINT_EVERY_S, self._paint)
        stream = self.backend.stream(request)
        # the first delta is stored at once: a kill right after it still leaves the reply
        last_save = 0.0
        try:
            async for delta in stream:
                message.content += delta.text
                message.thinking += delta.thinking
                self._calls.add(delta.tool_calls)
                stats.apply(delta)
                if time.monotonic() - last_save >= SAVE_EVERY_S:
                    message.meta.update(stats.as_meta())
                    session.save_message(position)
                    last_save = time.monotonic()
        except asyncio.CancelledError:
            self.stopped = True
        except LocalchatError as exc:
            self.error = exc.message
        except Exception as exc:  # an engine failure is a message in the chat, never a crash
            logger.exception("reply failed")
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            painter.stop()
            await stream.aclose()
            message.meta.update(stats.as_meta())
        await self._finish(position)

    @property
    def empty(self) -> bool:
        message = self.message
        return not (message.content or message.thinking or message.tool_calls)

    async def _paint(self) -> None:
        wall, cpu = time.monotonic(), time.thread_time()  # the event loop's thread
        last_wall, last_cpu = self._last_paint
        elapsed = wall - last_wall
        if elapsed < PAINT_AT_LEAST_EVERY_S and cpu - last_cpu > UI_CPU_BUDGET * elapsed:
            return
        self._last_paint = wall, cpu
        if await self.view.catch_up(self.message):
            self.view.set_meta(f"writing… {self.stats.completion_tokens} tok{STOP_HINT}")
            self.on_paint(self.stats)

    async def _finish(self, position: int) -> None:
        message, session = self.message, self.session
        message.stopped = self.stopped
        if self.error:
            message.meta["error"] = self.error
        if self.empty:
            session.remove_from(position)
            await self.view.remove()
        else:
            session.save_message(position)
            await self.view.finish(message)
