"""ChatApp: the Textual chat on any ChatBackend: loading, the conversation view, streaming replies, status."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from localchat.errors import LocalchatError
from localchat.tui.actions import ChatActions
from localchat.tui.backends import ChatBackend, ReplyStats
from localchat.tui.commands import COMMANDS
from localchat.tui.conversation import ChatMessage, Conversation
from localchat.tui.messages import (
    AssistantMessage,
    ConversationView,
    Notice,
    UserMessage,
)
from localchat.tui.session import CONTEXT_WARNING, ChatSession
from localchat.tui.store import ConversationStore
from localchat.tui.widgets import (
    ChatList,
    LoadingPanel,
    PromptBox,
    StatusBar,
    StatusInfo,
)

logger = logging.getLogger("localchat.tui")
_FOOTER = {"help", "new", "regen", "chats", "stop", "quit"}
SAVE_EVERY_S = 1.0  # how often a reply being streamed is written to the store
PAINT_EVERY_S = 0.1  # streamed text reaches the screen in batches
WELCOME = """Chat with {model} ({how}).

Enter sends · Shift+Enter or Ctrl+J adds a line · Up recalls earlier prompts
Esc stops a reply · F1 or /help lists keys and slash commands · Ctrl+P opens the command palette
Ctrl+B shows your conversations · Ctrl+Q quits"""


class ChatApp(ChatActions, App):
    """Chat with one model. The backend is started (loaded) in the background when the app mounts;
    messages typed meanwhile wait for it. Every message is stored as soon as it exists."""

    CSS_PATH = "chat.tcss"
    TITLE = "localchat"
    BINDINGS = [Binding(c.key, c.action, c.label, show=c.name in _FOOTER)
                for c in COMMANDS if c.key and c.name != "quit"]

    def __init__(self, backend: ChatBackend, store: ConversationStore | None = None, *,
                 conversation: Conversation | None = None, resume: bool = False, close_backend: bool = True):
        super().__init__()
        self.backend = backend
        self.store = store or ConversationStore(None)
        self.session = ChatSession(backend, self.store, conversation)
        self.resume = resume
        self.close_backend = close_backend
        self.state = "loading"
        self.ready = asyncio.Event()
        self.load_error: str | None = None
        self.reply_worker = None
        self.context_tokens: int | None = None  # what the conversation takes, for the status bar
        self.reply_stats = ReplyStats()  # the latest reply's figures, for the status bar
        self._warned_conversation: object = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield ChatList(id="chats")
            with Vertical(id="main"):
                yield ConversationView(id="messages")
                yield PromptBox(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        if self.resume and (last := self.store.last_id()) is not None:
            self.session.open(last)
        await self.render_conversation()
        await self.refresh_chat_list()
        self.query_one(PromptBox).focus()
        self.refresh_status()
        self.run_worker(self._load(), group="load", exit_on_error=False)

    async def on_unmount(self) -> None:
        if self.close_backend:
            await self.backend.close()

    # --- loading -------------------------------------------------------------------------------------
    async def _load(self) -> None:
        what = "Connecting to" if self.backend.description.startswith("http") else "Loading"
        panel = LoadingPanel(f"{what} {self.backend.model_name}", id="loading")
        await self.query_one("#main").mount(panel, before=0)
        try:
            await self.backend.start(panel.step)
        except Exception as exc:  # shown in the conversation; the app stays up
            self.load_error = exc.message if isinstance(exc, LocalchatError) else f"{type(exc).__name__}: {exc}"
            self.state = "error"
            await self.add_notice(f"Could not start {self.backend.model_name}: {self.load_error}", error=True)
        else:
            self.state = "idle"
            await self.update_context_tokens()
        finally:
            await panel.remove()
            self.ready.set()
            self.refresh_status()

    # --- the conversation view -----------------------------------------------------------------------
    @property
    def messages_view(self) -> ConversationView:
        return self.query_one(ConversationView)

    async def render_conversation(self) -> None:
        """Show the current conversation from scratch."""
        messages = self.session.conversation.messages
        await self.messages_view.show(messages, WELCOME.format(model=self.backend.model_name,
                                                               how=self.backend.description))
        self.query_one(PromptBox).set_history([m.content for m in messages if m.role == "user"])

    async def add_notice(self, text: str, *, error: bool = False) -> None:
        await self.messages_view.add(Notice(text, error=error))

    async def refresh_chat_list(self) -> None:
        await self.query_one(ChatList).show(self.store.list_conversations(), self.session.conversation.id)

    # --- status --------------------------------------------------------------------------------------
    async def update_context_tokens(self) -> None:
        """Count the tokens of the history as it stands (for the status bar)."""
        if self.state in ("loading", "error"):
            return
        try:
            self.context_tokens = await self.backend.count_prompt_tokens(self.session.request())
        except LocalchatError:
            self.context_tokens = None

    def refresh_status(self) -> None:
        """Give the status bar the figures as they are now; it repaints only if one changed. Called where they
        change (state changes, paint ticks, the end of a reply), never on a timer."""
        stats = self.backend.stats() if self.state != "loading" else None
        limit, max_tokens = self.backend.max_model_len, self.session.conversation.settings.get("max_tokens") or 0
        context = self.context_tokens
        info = StatusInfo(model=self.backend.model_name, state=self.state, ttft=self.reply_stats.ttft,
                          tokens_per_s=self.reply_stats.tokens_per_s, context_tokens=context, max_model_len=limit,
                          context_warning=bool(limit and context is not None
                                               and context + max_tokens > CONTEXT_WARNING * limit),
                          kv_cache_usage=stats.kv_cache_usage if stats else None,
                          prefix_cache_hits=stats.prefix_cache_hits if stats else None)
        for bar in self.query(StatusBar):  # none while the app shuts down
            bar.info = info

    def set_state(self, state: str) -> None:
        self.state = state
        self.refresh_status()
        self.refresh_bindings()

    @property
    def generating(self) -> bool:
        return self.reply_worker is not None and not self.reply_worker.is_finished

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop":
            return self.generating
        return True

    # --- sending and replying ------------------------------------------------------------------------
    async def on_prompt_box_submitted(self, event: PromptBox.Submitted) -> None:
        await self.submit(event.text)

    async def send(self, text: str) -> None:
        """Add a user message and start the reply to it."""
        new = self.session.conversation.id is None
        message = self.session.add_user(text)
        await self.messages_view.add(UserMessage(message.content, len(self.session.conversation.messages) - 1))
        if new:
            await self.refresh_chat_list()
        self.start_reply()

    def start_reply(self) -> None:
        self.reply_worker = self.run_worker(self._reply(), group="reply", exclusive=True, exit_on_error=False)
        self.set_state("generating" if self.ready.is_set() else self.state)

    async def _reply(self) -> None:
        view = AssistantMessage()
        await self.messages_view.add(view)
        self.reply_stats = ReplyStats()
        if not self.ready.is_set():
            view.set_meta("waiting for the model to load…")
            await self.ready.wait()
        if self.load_error is not None:
            await view.remove()
            await self.add_notice(f"No reply: the model did not start ({self.load_error})", error=True)
            return
        self.set_state("generating")
        try:
            await self._stream_reply(view)
        finally:
            self.set_state("idle")

    async def _stream_reply(self, view: AssistantMessage) -> None:
        session = self.session
        message, position, stopped, error = ChatMessage("assistant", ""), None, False, None
        stats = self.reply_stats
        stream = painter = None
        try:
            plan = await session.plan_turn()
            if plan.dropped:
                limit = self.backend.max_model_len
                await self.messages_view.add(Notice(
                    f"⚠ {plan.dropped} earlier message(s) no longer fit in the context ({limit} tokens) and "
                    "are left out of the prompt from now on."), before=view)
            self.context_tokens = plan.prompt_tokens
            self._maybe_warn(plan.context_used)
            position = session.add_reply(message)
            last_save = 0.0
            painter = self.set_interval(PAINT_EVERY_S, partial(self._paint, view, message, stats))
            stream = self.backend.stream(plan.request)
            async for delta in stream:
                message.content += delta.text
                message.thinking += delta.thinking
                stats.apply(delta)
                if time.monotonic() - last_save >= SAVE_EVERY_S:
                    message.meta.update(stats.as_meta())
                    session.save_message(position)
                    last_save = time.monotonic()
        except asyncio.CancelledError:
            stopped = True
        except LocalchatError as exc:
            error = exc.message
        except Exception as exc:  # an engine failure is a message in the chat, never a crash
            logger.exception("reply failed")
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if painter is not None:
                painter.stop()
            if stream is not None:
                await stream.aclose()
            message.meta.update(stats.as_meta())
        await self._finish_reply(view, message, position, stopped, error)
        self.refresh_status()

    async def _finish_reply(self, view: AssistantMessage, message: ChatMessage, position: int | None,
                            stopped: bool, error: str | None) -> None:
        session = self.session
        message.stopped = stopped
        if error:
            message.meta["error"] = error
        empty = not (message.content or message.thinking)
        if position is not None and not empty:
            session.save_message(position)
        elif position is not None:
            session.remove_from(position)
        if empty:
            await view.remove()
        else:
            await view.finish(message)
        if error:
            await self.add_notice(f"Error: {error}", error=True)
        elif empty and stopped:
            await self.add_notice("Stopped before the first token.")
        tokens = (message.meta.get("prompt_tokens") or 0) + (message.meta.get("completion_tokens") or 0)
        self.context_tokens = tokens or self.context_tokens

    async def _paint(self, view: AssistantMessage, message: ChatMessage, stats: ReplyStats) -> None:
        """Show what streamed in since the last paint (a timer: painting every token would slow the engine)."""
        if await view.catch_up(message):
            view.set_meta(f"writing… {stats.completion_tokens} tok")
            if stats.context_tokens is not None:
                self.context_tokens = stats.context_tokens
            self.refresh_status()

    def _maybe_warn(self, context_used: float | None) -> None:
        conversation = self.session.conversation
        if context_used is not None and context_used > CONTEXT_WARNING and self._warned_conversation is not conversation:
            self._warned_conversation = conversation
            self.notify(f"This chat fills {context_used:.0%} of the context; soon the oldest turns will be "
                        "left out of the prompt.", title="Context nearly full", severity="warning", timeout=8)

    def on_worker_state_changed(self) -> None:
        self.refresh_bindings()  # Esc (stop) shows only while a reply runs

    async def stop_reply(self) -> None:
        """Stop the running reply (the engine request is aborted; the partial reply is kept)."""
        worker = self.reply_worker
        if worker is not None and not worker.is_finished:
            worker.cancel()
            try:
                await worker.wait()
            except Exception:
                pass
